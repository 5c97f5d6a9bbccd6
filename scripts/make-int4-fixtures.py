#!/usr/bin/env python3
"""Writes the tiny GPTQ-layout INT4 checkpoints of tests/fixtures.

Neither `gptqmodel` nor `auto-round` installs on a CPU-only box here, so the
tensors are packed by hand from the published layout (AutoGPTQ / GPTQModel
`QuantLinear`, which AutoRound's `auto_round:auto_gptq` export follows):

- `qweight` I32 [in/8, out]: 8 4-bit codes per int32 along the INPUT
  dimension, element `8k + j` of column `o` in bits 4j..4j+4 of word (k, o);
- `qzeros` I32 [in/group, out/8]: the zero points packed the same way along
  the OUTPUT dimension; GPTQ v1 (`checkpoint_format: gptq`, and AutoRound's
  auto_gptq packing) stores zero − 1, GPTQ v2 the zero itself;
- `scales` F16 [in/group, out]; `g_idx` I32 [in] = c // group (no act order);
- value = (code − zero) × scale.

The weights of tests/fixtures/qwen3-moe-tiny are quantized round-to-nearest
(groups of 32 input columns) in the attention projections and the routed
experts; embeddings, norms, router and lm_head stay bf16. The reference is
transformers' Qwen3MoeForCausalLM in float32 on the dequantized weights
(exactly representable: a small integer times an f16).

- `qwen3-moe-tiny-int4`: `quant_method: auto-round`, packing
  `auto_round:auto_gptq`, symmetric (every zero 8, stored 7),
  `block_name_to_quantize: model.layers`, the router left 16-bit through
  `extra_config`.
- `qwen3-moe-tiny-int4-asym`: `quant_method: gptq`, `checkpoint_format:
  gptq_v2`, asymmetric (min-max zeros), `modules_to_not_convert` for the router.

Usage: python3 scripts/make-int4-fixtures.py [--out tests/fixtures]
"""

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parent.parent
GROUP = 32
GREEDY_TOKENS = 24
QUANTIZED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantize(w, sym):
    """w [out, in] float -> (codes [out, in] int, zeros [out, groups] int, scales f16 [out, groups])."""
    out, inp = w.shape
    g = w.float().reshape(out, inp // GROUP, GROUP)
    if sym:
        scale = (g.abs().amax(-1) / 7.0).clamp(min=1e-6)
        zero = torch.full_like(scale, 8, dtype=torch.int64)
    else:
        lo, hi = g.amin(-1), g.amax(-1)
        scale = ((hi - lo) / 15.0).clamp(min=1e-6)
        zero = torch.round(-lo / scale).clamp(0, 15).to(torch.int64)
    scale = scale.half()
    codes = torch.round(g / scale.float()[..., None]) + zero[..., None]
    codes = codes.clamp(0, 15).to(torch.int64).reshape(out, inp)
    return codes, zero, scale


def dequantize(codes, zero, scale):
    out, inp = codes.shape
    z = zero.repeat_interleave(GROUP, dim=1)
    s = scale.float().repeat_interleave(GROUP, dim=1)
    return (codes - z).float() * s


def to_i32(words64):
    # Two's complement of the unsigned 32-bit word.
    words64 = words64 & 0xFFFFFFFF
    return torch.where(words64 >= 2**31, words64 - 2**32, words64).to(torch.int32)


def pack(values):
    n, m = values.shape
    v = values.reshape(n // 8, 8, m).to(torch.int64)
    word = torch.zeros(n // 8, m, dtype=torch.int64)
    for j in range(8):
        word |= v[:, j, :] << (4 * j)
    return to_i32(word)


def gptq_tensors(name, w, sym, zero_offset):
    codes, zero, scale = quantize(w, sym)
    module = name[: -len(".weight")]
    stored_zero = zero - zero_offset
    assert stored_zero.min() >= 0 and stored_zero.max() <= 15
    tensors = {
        f"{module}.qweight": pack(codes.t().contiguous()),  # [in/8, out]
        f"{module}.qzeros": pack(stored_zero.contiguous()).t().contiguous(),  # [groups, out/8]
        f"{module}.scales": scale.t().contiguous(),  # [groups, out]
        f"{module}.g_idx": (torch.arange(w.shape[1]) // GROUP).to(torch.int32),
    }
    return tensors, dequantize(codes, zero, scale)


def build(src, folder, sym, zero_offset, quant_config):
    folder.mkdir(parents=True, exist_ok=True)
    state = load_file(src / "model.safetensors")
    packed, dense = {}, {}
    for name, t in state.items():
        parts = name.split(".")
        if name.endswith(".weight") and len(parts) >= 2 and parts[-2] in QUANTIZED:
            tensors, deq = gptq_tensors(name, t, sym, zero_offset)
            packed.update(tensors)
            dense[name] = deq
        else:
            packed[name] = t
            dense[name] = t.float()
    save_file(packed, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = quant_config
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
        shutil.copy(src / f, folder / f)
    return config, dense


def greedy(model, ids):
    out = ids.clone()
    with torch.no_grad():
        for _ in range(GREEDY_TOKENS):
            logits = model(input_ids=out[None]).logits[0, -1]
            out = torch.cat([out, logits.argmax().reshape(1)])
    return out[len(ids):]


def reference(config, dense, ids, folder):
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        plain = {k: v for k, v in config.items() if k != "quantization_config"}
        (tmp / "config.json").write_text(json.dumps(plain))
        save_file({k: v.contiguous() for k, v in dense.items()}, tmp / "model.safetensors", metadata={"format": "pt"})
        model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids[None]).logits[0].float()
    greedy_ids = greedy(model, ids)
    top = logits.topk(2, dim=-1).values
    save_file(
        {"input_ids": ids, "logits": logits.contiguous(), "greedy_ids": greedy_ids},
        folder / "reference.safetensors",
    )
    info = {
        "oracle": "transformers Qwen3MoeForCausalLM, float32, eager attention, on the dequantized INT4 weights",
        "input_ids": ids.tolist(),
        "greedy_ids": greedy_ids.tolist(),
        "min_top1_margin": float((top[:, 0] - top[:, 1]).min()),
    }
    (folder / "reference.json").write_text(json.dumps(info, indent=1) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures")
    args = parser.parse_args()
    torch.set_num_threads(2)
    src = args.out / "qwen3-moe-tiny"
    ids = load_file(src / "reference.safetensors")["input_ids"]
    variants = [
        (
            "qwen3-moe-tiny-int4",
            True,
            1,
            {
                "quant_method": "auto-round",
                "packing_format": "auto_round:auto_gptq",
                "bits": 4,
                "group_size": GROUP,
                "sym": True,
                "data_type": "int",
                "block_name_to_quantize": "model.layers",
                "extra_config": {f"model.layers.{i}.mlp.gate": {"bits": 16} for i in range(4)},
            },
        ),
        (
            "qwen3-moe-tiny-int4-asym",
            False,
            0,
            {
                "quant_method": "gptq",
                "checkpoint_format": "gptq_v2",
                "bits": 4,
                "group_size": GROUP,
                "sym": False,
                "desc_act": False,
                "modules_to_not_convert": ["lm_head", "model.layers.*.mlp.gate"],
            },
        ),
    ]
    for name, sym, offset, qc in variants:
        folder = args.out / name
        config, dense = build(src, folder, sym, offset, qc)
        reference(config, dense, ids, folder)
        print(name, (folder / "model.safetensors").stat().st_size, "bytes")


if __name__ == "__main__":
    main()
