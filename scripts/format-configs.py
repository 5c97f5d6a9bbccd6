#!/usr/bin/env python3
"""Prints a bench model's config.json in one weight format: the config at
CONFIG cut to LAYERS layers, with the `quantization_config` that format's
tool writes (`sparkrt make-checkpoint --like` then writes random weights in
that layout). Used by scripts/format-bench.sh.

  python3 scripts/format-configs.py CONFIG FORMAT LAYERS
"""

import json
import sys

# Each format's quantization_config as its tool writes it (the keys sparkrt
# reads and the ones naming the layout).
FORMATS = {
    "bf16": None,
    # ModelOpt NVFP4: experts (and dense MLPs) in NVFP4, attention bf16.
    "nvfp4": {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "group_size": 16,
        "exclude_modules": ["lm_head", "model.layers.*.self_attn*", "model.layers.*.mlp.gate"],
    },
    # compressed-tensors NVFP4 W4A16: every linear but the router and lm_head.
    "ct-nvfp4": {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 4,
                    "type": "float",
                    "symmetric": True,
                    "group_size": 16,
                    "strategy": "tensor_group",
                    "dynamic": False,
                },
            }
        },
        "ignore": ["lm_head", "re:.*mlp.gate$"],
        "quantization_status": "compressed",
    },
    # GPTQ INT4 (AutoGPTQ v1 zeros, symmetric, groups of 128) as Intel's
    # AutoRound checkpoints: every linear but the router and lm_head.
    "int4": {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": 128,
        "sym": True,
        "desc_act": False,
        "checkpoint_format": "gptq",
        "modules_to_not_convert": ["lm_head", "model.layers.*.mlp.gate"],
    },
    # FP8 block-128 (Qwen's -FP8 releases): experts FP8, the rest bf16.
    "fp8-block": {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": ["lm_head", "model.layers.*.self_attn*", "model.layers.*.mlp.gate"],
    },
    # ModelOpt MIXED_PRECISION as nvidia/Qwen3.6-35B-A3B-NVFP4
    # (docs QWEN35.md, "Formats"): NVFP4 on the experts and lm_head, FP8
    # per tensor on the attention projections, the router bf16. Its
    # `quantized_layers` names every module, so it is built per layer count.
    "modelopt-mixed": lambda layers: {
        "quant_method": "modelopt",
        "quant_algo": "MIXED_PRECISION",
        "exclude_modules": ["model.layers.*.mlp.gate"],
        "quantized_layers": {
            "lm_head": {"quant_algo": "NVFP4", "group_size": 16},
            **{
                f"model.layers.{layer}.self_attn.{proj}": {"quant_algo": "FP8"}
                for layer in range(layers)
                for proj in ["q_proj", "k_proj", "v_proj", "o_proj"]
            },
            **{
                f"model.layers.{layer}.mlp.experts": {"quant_algo": "NVFP4", "group_size": 16}
                for layer in range(layers)
            },
        },
    },
}
# GPTQ INT4 on the experts only: attention, router and lm_head bf16 (as the
# nvfp4 case).
FORMATS["int4-experts"] = {
    **FORMATS["int4"],
    "modules_to_not_convert": ["lm_head", "model.layers.*.self_attn*", "model.layers.*.mlp.gate"],
}


def main():
    path, fmt, layers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if fmt not in FORMATS:
        sys.exit(f"unknown format {fmt} (known: {', '.join(FORMATS)})")
    with open(path) as f:
        config = json.load(f)
    config["num_hidden_layers"] = layers
    quantization = FORMATS[fmt]
    if callable(quantization):
        quantization = quantization(layers)
    if quantization is not None:
        config["quantization_config"] = quantization
    json.dump(config, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
