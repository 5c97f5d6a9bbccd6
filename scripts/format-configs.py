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
    # GPTQ INT4 (AutoGPTQ v1 zeros, symmetric, groups of 128): experts
    # INT4, attention, router and lm_head bf16 (as the nvfp4 case).
    "int4": {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": 128,
        "sym": True,
        "desc_act": False,
        "checkpoint_format": "gptq",
        "modules_to_not_convert": ["lm_head", "model.layers.*.self_attn*", "model.layers.*.mlp.gate"],
    },
    # FP8 block-128 (Qwen's -FP8 releases): experts FP8, the rest bf16.
    "fp8-block": {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": ["lm_head", "model.layers.*.self_attn*", "model.layers.*.mlp.gate"],
    },
}


def main():
    path, fmt, layers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if fmt not in FORMATS:
        sys.exit(f"unknown format {fmt} (known: {', '.join(FORMATS)})")
    with open(path) as f:
        config = json.load(f)
    config["num_hidden_layers"] = layers
    if FORMATS[fmt] is not None:
        config["quantization_config"] = FORMATS[fmt]
    json.dump(config, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
