#!/usr/bin/env python3
"""Regenerates tests/data/fp8_kv_reference.safetensors: transformers' f32
logits of each fixture's reference prompt with every attention layer's keys
(after RoPE) and values rounded as sparkrt's FP8 KV cache stores them:
`torch.clamp(x / s, -448, 448).to(torch.float8_e4m3fn)` back to f32, times
`s`. `{fixture}.logits` has every scale 1.0 (a checkpoint without scales);
`{fixture}.scaled_logits` has layer l's K scale `K_SCALE * (l + 1)` and V
scale `V_SCALE * (l + 1)`, as tests/kv_fp8.rs writes them into a copy of the
fixture. The prompt is `{fixture}.input_ids`.

Needs torch, safetensors and transformers 4.51 (the version that wrote the
fixture and its reference.safetensors; its f32 logits match those to 5e-6):
    python3 scripts/fp8-kv-reference.py [OUT]
"""

import importlib
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AttentionInterface, AutoModelForCausalLM

REPO = Path(__file__).resolve().parent.parent
FIXTURES = {
    "qwen3-moe-tiny": "transformers.models.qwen3_moe.modeling_qwen3_moe",
}


K_SCALE = 0.02
V_SCALE = 0.015


def fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    """What the cache gives back for x: E4M3 of x / scale, saturating."""
    s = torch.tensor(scale, dtype=x.dtype)
    return (x / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(x.dtype) * s


def logits(name: str, module: str, scales) -> tuple:
    eager = importlib.import_module(module).eager_attention_forward

    def attention(mod, query, key, value, *args, **kwargs):
        k, v = scales(mod.layer_idx)
        return eager(mod, query, fp8(key, k), fp8(value, v), *args, **kwargs)

    AttentionInterface.register("sparkrt_fp8_kv", attention)
    folder = REPO / "tests/fixtures" / name
    model = AutoModelForCausalLM.from_pretrained(
        folder, torch_dtype=torch.float32, attn_implementation="sparkrt_fp8_kv"
    )
    model.eval()
    ids = json.loads((folder / "reference.json").read_text())["input_ids"]
    input_ids = torch.tensor([ids], dtype=torch.int64)
    with torch.no_grad():
        out = model(input_ids).logits[0].float().contiguous()
    return input_ids[0], out


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "tests/data/fp8_kv_reference.safetensors"
    tensors = {}
    for name, module in FIXTURES.items():
        ids, unit = logits(name, module, lambda layer: (1.0, 1.0))
        _, scaled = logits(
            name, module, lambda layer: (K_SCALE * (layer + 1), V_SCALE * (layer + 1))
        )
        tensors[f"{name}.input_ids"] = ids
        tensors[f"{name}.logits"] = unit
        tensors[f"{name}.scaled_logits"] = scaled
        print(f"{name}: {len(ids)} positions")
    save_file(tensors, out, metadata={"torch": torch.__version__})
    print(f"written to {out}")


if __name__ == "__main__":
    main()
