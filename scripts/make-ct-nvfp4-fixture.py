#!/usr/bin/env python3
"""Writes tests/fixtures/qwen35-moe-tiny-ct-nvfp4: the tiny Qwen3.5 MoE in the
compressed-tensors NVFP4 layout (`nvfp4-pack-quantized`) RedHatAI and
llm-compressor publish, with transformers' reference outputs.

  python3 scripts/make-ct-nvfp4-fixture.py [--out tests/fixtures]

Needs torch, transformers 5.24 and compressed-tensors 0.20 (CPU). Starts from
the bf16 `qwen35-moe-tiny` fixture and quantizes every linear module of the
language model except the ignore list (lm_head, the router `mlp.gate`, the
`[1, H]` shared-expert gate, the vision tower and the MTP head), the
projections of the attention and Gated DeltaNet layers included:

- scales come from compressed-tensors' own `generate_gparam` (the per-tensor
  global scale) and `calculate_qparams` (the E4M3 group scales), as
  llm-compressor's min-max observer feeds them, and the codes are packed by
  its `NVFP4PackedCompressor`, so the bytes are the tool's;
- the config is compressed-tensors' `QuantizationConfig`, serialized by it;
- the oracle is `Qwen3_5MoeForConditionalGeneration` in float32 over the
  dequantized weights, computed here in float32 as
  e2m1(code) * e4m3(scale) / weight_global_scale (compressed-tensors' own
  decompression rounds through bf16; the script checks that it agrees with
  that value to bf16 precision, so the layout is read as the tool reads it).
"""

import argparse
import json
import shutil
from pathlib import Path

import torch
from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
from compressed_tensors.config import CompressionFormat
from compressed_tensors.quantization import (
    QuantizationConfig,
    QuantizationStatus,
    preset_name_to_scheme,
)
from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam
from safetensors.torch import load_file, save_file

import transformers

ROOT = Path(__file__).resolve().parent.parent
NAME = "qwen35-moe-tiny-ct-nvfp4"
GREEDY_TOKENS = 24
PREFIX = "model.language_model."
IGNORE = [
    "lm_head",
    "re:.*mlp.gate$",
    "re:.*shared_expert_gate$",
    "re:.*visual.*",
    "re:mtp.*",
]


def quantized(name, tensor):
    """Whether `name` is a linear weight the config's targets quantize."""
    if not (name.startswith(PREFIX + "layers.") and name.endswith(".weight")):
        return False
    if tensor.dim() != 2:
        return False
    module = name[: -len(".weight")]
    return not (module.endswith("mlp.gate") or module.endswith("shared_expert_gate"))


def quantize(weight, scheme):
    """The compressed tensors of one weight, made by compressed-tensors."""
    w = weight.float()
    rows, cols = w.shape
    global_scale = generate_gparam(w.min(), w.max())
    groups = w.reshape(rows, cols // 16, 16)
    scale, zero = calculate_qparams(
        groups.amin(dim=-1), groups.amax(dim=-1), scheme.weights, global_scale=global_scale
    )
    state = {
        "weight": w,
        "weight_scale": scale,
        "weight_global_scale": global_scale,
        "weight_zero_point": zero,
    }
    return NVFP4PackedCompressor.compress(state, scheme)


def dequantize(packed, scale, global_scale):
    """e2m1(code) * e4m3(scale) / global_scale, in float32."""
    rows, half = packed.shape
    codes = unpack_fp4_from_uint8(packed, rows, 2 * half, dtype=torch.float32)
    scales = scale.float().repeat_interleave(16, dim=1)
    return codes * scales / global_scale.float()


def greedy(model, ids):
    out = ids.clone()
    with torch.no_grad():
        for _ in range(GREEDY_TOKENS):
            logits = model(input_ids=out[None]).logits[0, -1]
            out = torch.cat([out, logits.argmax().reshape(1)])
    return out[len(ids) :]


def reference(model, prompts, folder):
    tensors = {}
    info = {
        "oracle": "transformers Qwen3_5MoeForConditionalGeneration, float32 over "
        "the dequantized NVFP4 weights, torch fallbacks"
    }
    for prefix, ids in prompts.items():
        with torch.no_grad():
            logits = model(input_ids=ids[None]).logits[0].float()
        tensors[f"{prefix}input_ids"] = ids
        tensors[f"{prefix}logits"] = logits.contiguous()
        tensors[f"{prefix}greedy_ids"] = greedy(model, ids)
        info[f"{prefix}input_ids"] = ids.tolist()
        info[f"{prefix}greedy_ids"] = tensors[f"{prefix}greedy_ids"].tolist()
        top = logits.topk(2, dim=-1).values
        info[f"{prefix}min_top1_margin"] = float((top[:, 0] - top[:, 1]).min())
    save_file(tensors, folder / "reference.safetensors")
    (folder / "reference.json").write_text(json.dumps(info, indent=1) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures")
    args = parser.parse_args()
    torch.set_num_threads(2)
    source = args.out / "qwen35-moe-tiny"
    folder = args.out / NAME
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)

    scheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    state = load_file(source / "model.safetensors")
    stored, dequantized = {}, {}
    for name, tensor in state.items():
        if not quantized(name, tensor):
            stored[name] = tensor
            continue
        module = name[: -len(".weight")]
        compressed = quantize(tensor, scheme)
        for key in ["weight_packed", "weight_scale", "weight_global_scale"]:
            stored[f"{module}.{key}"] = compressed[key].contiguous()
        value = dequantize(
            compressed["weight_packed"],
            compressed["weight_scale"],
            compressed["weight_global_scale"],
        )
        tool = NVFP4PackedCompressor.decompress(dict(compressed), scheme)["weight"].float()
        assert torch.allclose(tool, value, rtol=2**-7, atol=0), f"{module}: layout disagrees"
        dequantized[name] = value
    save_file(stored, folder / "model.safetensors", metadata={"format": "pt"})

    config = json.loads((source / "config.json").read_text())
    quant = QuantizationConfig(
        config_groups={"group_0": scheme},
        format=CompressionFormat.nvfp4_pack_quantized.value,
        ignore=IGNORE,
        quantization_status=QuantizationStatus.COMPRESSED,
    )
    config["quantization_config"] = quant.model_dump(exclude_none=True)
    config["quantization_config"]["quant_method"] = "compressed-tensors"
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
        shutil.copy(source / name, folder / name)

    # The oracle: the bf16 model in float32 with the dequantized weights.
    model = transformers.Qwen3_5MoeForConditionalGeneration.from_pretrained(
        source, dtype=torch.float32
    ).eval()
    params = dict(model.named_parameters())
    loaded = model.state_dict()
    with torch.no_grad():
        for name, value in dequantized.items():
            if name in params:
                params[name].copy_(value)
                continue
            # transformers keeps the experts stacked: `experts.E.gate_proj`
            # is row block E of `experts.gate_up_proj` (gate rows first).
            layer, rest = name[len(PREFIX + "layers.") :].split(".", 1)
            base = f"{PREFIX}layers.{layer}.mlp.experts"
            expert, proj = rest[len("mlp.experts.") :].split(".")[:2]
            e = int(expert)
            gate_up = params[f"{base}.gate_up_proj"]
            inter = gate_up.shape[1] // 2
            if proj == "gate_proj":
                gate_up[e, :inter].copy_(value)
            elif proj == "up_proj":
                gate_up[e, inter:].copy_(value)
            else:
                params[f"{base}.down_proj"][e].copy_(value)
    assert loaded is not None
    ref = load_file(source / "reference.safetensors")
    prompts = {"": ref["input_ids"], "long_": ref["long_input_ids"]}
    reference(model, prompts, folder)


if __name__ == "__main__":
    main()
