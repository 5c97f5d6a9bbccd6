#!/usr/bin/env python3
"""Writes the tiny FP8 reference checkpoints of tests/fixtures.

  python3 scripts/make-fp8-fixtures.py [--out tests/fixtures]

Needs transformers 5.24 and torch (CPU). Both folders hold the same random
`qwen3_moe` model (hidden 160, so that 128 × 128 blocks are ragged at the
edge and every matrix has two blocks along its hidden side), quantized by
hand from the published layouts:

- `qwen3-moe-tiny-fp8-block`: Qwen's `-FP8` layout (transformers' fine-grained
  FP8): `quantization_config {quant_method: fp8, fmt: e4m3, activation_scheme:
  dynamic, weight_block_size: [128, 128], modules_to_not_convert}`; each
  quantized linear is `weight` F8_E4M3 [out, in] and `weight_scale_inv` F32
  [ceil(out/128), ceil(in/128)], the value being e4m3 × scale_inv of its
  block. Router and lm_head stay BF16.
- `qwen3-moe-tiny-modelopt-mixed`: ModelOpt MIXED_PRECISION as
  `nvidia/Qwen3.6-35B-A3B-NVFP4` (hf_quant_config.json and config.json
  `quantization_config`, `quantized_layers` per module): NVFP4 routed
  experts (`weight` U8 packed E2M1 [out, in/2], `weight_scale` F8_E4M3
  [out, in/16], `weight_scale_2` F32, `input_scale` F32) and FP8 attention
  projections (`weight` F8_E4M3, `weight_scale` F32 per tensor,
  `input_scale` F32), `kv_cache_quant_algo: FP8` (no KV scales written: the
  KV cache is another change's), router and lm_head BF16 (`exclude_modules`).

The oracle is transformers' `Qwen3MoeForCausalLM` in float32 over the
dequantized weights (written as an f32 checkpoint in a temporary folder and
read back by `from_pretrained`). For the block-wise folder, transformers'
own FP8 dequantization (`integrations.finegrained_fp8`) of the stored
tensors is checked to give the same weights bit for bit, so the rule
(e4m3 × `weight_scale_inv` of its block, ragged edges) is transformers'. `reference.safetensors` holds `input_ids`, `logits`
(f32, every position) and `greedy_ids` (24 tokens, no EOS stop).
"""

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

import transformers

GREEDY_TOKENS = 24
ROOT = Path(__file__).resolve().parent.parent
BLOCK = 128
E4M3_MAX = 448.0
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])

CONFIG = dict(
    architectures=["Qwen3MoeForCausalLM"],
    model_type="qwen3_moe",
    vocab_size=512,
    hidden_size=160,
    intermediate_size=256,
    moe_intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=32,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    hidden_act="silu",
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    max_position_embeddings=4096,
    attention_bias=False,
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=511,
    torch_dtype="bfloat16",
)


def random_state(seed):
    """Per-expert qwen3_moe tensors (the hub layout), f32, scaled so that
    greedy decoding has a clear winner."""
    c = CONFIG
    g = torch.Generator().manual_seed(seed)
    h, v, hd = c["hidden_size"], c["vocab_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    i, e = c["moe_intermediate_size"], c["num_experts"]

    def linear(rows, cols):
        return torch.randn(rows, cols, generator=g) / cols**0.5

    def norm(n):
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    s = {"model.embed_tokens.weight": torch.randn(v, h, generator=g)}
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        s[f"{p}.input_layernorm.weight"] = norm(h)
        s[f"{p}.post_attention_layernorm.weight"] = norm(h)
        s[f"{p}.self_attn.q_proj.weight"] = linear(q, h)
        s[f"{p}.self_attn.k_proj.weight"] = linear(kv, h)
        s[f"{p}.self_attn.v_proj.weight"] = linear(kv, h)
        s[f"{p}.self_attn.o_proj.weight"] = linear(h, q)
        s[f"{p}.self_attn.q_norm.weight"] = norm(hd)
        s[f"{p}.self_attn.k_norm.weight"] = norm(hd)
        s[f"{p}.mlp.gate.weight"] = linear(e, h)
        for x in range(e):
            s[f"{p}.mlp.experts.{x}.gate_proj.weight"] = linear(i, h)
            s[f"{p}.mlp.experts.{x}.up_proj.weight"] = linear(i, h)
            s[f"{p}.mlp.experts.{x}.down_proj.weight"] = linear(h, i)
    s["model.norm.weight"] = norm(h)
    s["lm_head.weight"] = linear(v, h) * 4.0
    # Stored as bf16: the oracle sees the rounded values.
    return {k: t.to(torch.bfloat16).float() for k, t in s.items()}


def to_e4m3(x):
    """Round to E4M3 (nearest even, torch's cast), saturating at ±448."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def fp8_block(w):
    """(values, scale_inv, dequantized): one f32 scale per 128 × 128 block,
    amax / 448, ragged edge blocks included."""
    rows, cols = w.shape
    br, bc = -(-rows // BLOCK), -(-cols // BLOCK)
    scale = torch.empty(br, bc)
    for r in range(br):
        for c in range(bc):
            tile = w[r * BLOCK:(r + 1) * BLOCK, c * BLOCK:(c + 1) * BLOCK]
            scale[r, c] = tile.abs().max().clamp(min=1e-12) / E4M3_MAX
    full = scale.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    values = to_e4m3(w / full)
    return values, scale, values.float() * full


def fp8_tensor(w):
    """ModelOpt FP8: (values, weight_scale, dequantized), scale amax / 448."""
    scale = (w.abs().max() / E4M3_MAX).reshape(())
    values = to_e4m3(w / scale)
    return values, scale, values.float() * scale


def nvfp4(w):
    """ModelOpt NVFP4: (packed codes, E4M3 scales per 16, weight_scale_2,
    dequantized). global = amax / (6 · 448); each block's scale is its
    amax / 6 / global in E4M3; codes round |w| / (scale · global) to the
    nearest E2M1 value (ties to the lower code), the sign in bit 3."""
    rows, cols = w.shape
    global_scale = (w.abs().max() / (6.0 * E4M3_MAX)).reshape(())
    blocks = w.reshape(rows, cols // 16, 16)
    scales = to_e4m3(blocks.abs().amax(-1) / 6.0 / global_scale)
    step = scales.float() * global_scale
    scaled = blocks / step.clamp(min=1e-30)[..., None]
    codes = (scaled.abs()[..., None] - E2M1).abs().argmin(-1)
    codes = codes | ((scaled < 0) & (codes > 0)).long() << 3
    values = E2M1[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
    deq = (values * step[..., None]).reshape(rows, cols)
    codes = codes.reshape(rows, cols).to(torch.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed, scales, global_scale, deq


def is_expert(name):
    return ".mlp.experts." in name


def is_attention(name):
    return ".self_attn." in name and name.endswith("_proj.weight")


def quantize_block(state):
    stored, deq = {}, {}
    for name, w in state.items():
        if is_expert(name) or is_attention(name):
            module = name.removesuffix(".weight")
            values, scale, d = fp8_block(w)
            stored[name] = values
            stored[f"{module}.weight_scale_inv"] = scale
            deq[name] = d
        else:
            stored[name] = w.to(torch.bfloat16)
            deq[name] = w
    return stored, deq


def quantize_mixed(state):
    stored, deq = {}, {}
    for name, w in state.items():
        module = name.removesuffix(".weight")
        if is_expert(name):
            packed, scales, global_scale, d = nvfp4(w)
            stored[name] = packed
            stored[f"{module}.weight_scale"] = scales
            stored[f"{module}.weight_scale_2"] = global_scale.float()
            stored[f"{module}.input_scale"] = torch.tensor(0.02)
        elif is_attention(name):
            values, scale, d = fp8_tensor(w)
            stored[name] = values
            stored[f"{module}.weight_scale"] = scale.float()
            stored[f"{module}.input_scale"] = torch.tensor(0.05)
        else:
            stored[name], d = w.to(torch.bfloat16), w
        deq[name] = d
    return stored, deq


def layers_of(state):
    return sorted({int(n.split(".")[2]) for n in state if n.startswith("model.layers.")})


def block_quant_config(state):
    not_converted = ["lm_head"] + [f"model.layers.{l}.mlp.gate" for l in layers_of(state)]
    return {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [BLOCK, BLOCK],
        "modules_to_not_convert": not_converted,
    }


def mixed_quant(state):
    layers = {}
    for layer in layers_of(state):
        p = f"model.layers.{layer}"
        for proj in ["q_proj", "k_proj", "v_proj", "o_proj"]:
            layers[f"{p}.self_attn.{proj}"] = {"quant_algo": "FP8"}
        for x in range(CONFIG["num_experts"]):
            for proj in ["gate_proj", "up_proj", "down_proj"]:
                layers[f"{p}.mlp.experts.{x}.{proj}"] = {"quant_algo": "NVFP4", "group_size": 16}
    return {
        "quant_algo": "MIXED_PRECISION",
        "kv_cache_quant_algo": "FP8",
        "exclude_modules": ["lm_head", "model.layers.*.mlp.gate"],
        "quantized_layers": layers,
    }


def oracle(deq, tmp):
    """Qwen3MoeForCausalLM in float32 over the dequantized weights."""
    (tmp / "config.json").write_text(json.dumps(CONFIG))
    save_file({k: v.contiguous() for k, v in deq.items()}, tmp / "model.safetensors")
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        tmp, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.eval()


def greedy(model, ids):
    out = ids.clone()
    with torch.no_grad():
        for _ in range(GREEDY_TOKENS):
            logits = model(input_ids=out[None]).logits[0, -1]
            out = torch.cat([out, logits.argmax().reshape(1)])
    return out[len(ids):]


def write(folder, stored, quant, hf_quant, deq, ids, shared):
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    config = dict(CONFIG, quantization_config=quant)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if hf_quant is not None:
        body = {"producer": {"name": "modelopt", "version": "0.37.0"}, "quantization": hf_quant}
        (folder / "hf_quant_config.json").write_text(json.dumps(body, indent=2) + "\n")
    save_file(
        {k: v.contiguous() for k, v in sorted(stored.items())},
        folder / "model.safetensors",
        metadata={"format": "pt"},
    )
    for name in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(shared / name, folder / name)
    (folder / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": 511, "do_sample": False}, indent=2) + "\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        model = oracle(deq, Path(tmp))
        with torch.no_grad():
            logits = model(input_ids=ids[None]).logits[0].float()
        greedy_ids = greedy(model, ids)
    save_file(
        {"input_ids": ids, "logits": logits.contiguous(), "greedy_ids": greedy_ids},
        folder / "reference.safetensors",
    )
    top = logits.topk(2, dim=-1).values
    info = {
        "input_ids": ids.tolist(),
        "greedy_ids": greedy_ids.tolist(),
        "oracle": "transformers Qwen3MoeForCausalLM, float32, eager attention, "
        "dequantized weights",
        "min_top1_margin": float((top[:, 0] - top[:, 1]).min()),
    }
    (folder / "reference.json").write_text(json.dumps(info, indent=1) + "\n")
    return logits


def transformers_dequantizes_alike(stored, deq):
    """transformers' own block-wise FP8 dequantization (the one its FP8 linear
    uses, 128-column blocks with a ragged remainder) gives the oracle's
    weights bit for bit. (Its load-time `dequantize=True` path is not used:
    in 5.24 it derives the block from `cols // scale_cols`, 80 columns here,
    which misreads ragged grids.)"""
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

    for name, values in stored.items():
        if values.dtype != torch.float8_e4m3fn:
            continue
        scale = stored[name.removesuffix(".weight") + ".weight_scale_inv"]
        theirs = _dequantize_fp8_weight(values, scale, [BLOCK, BLOCK], torch.float32)
        assert torch.equal(theirs, deq[name]), name


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures")
    args = parser.parse_args()
    torch.set_num_threads(2)
    shared = args.out / "qwen3-moe-tiny"
    ids = load_file(shared / "reference.safetensors")["input_ids"]
    state = random_state(2028)

    stored, deq = quantize_block(state)
    folder = args.out / "qwen3-moe-tiny-fp8-block"
    write(folder, stored, block_quant_config(state), None, deq, ids, shared)
    transformers_dequantizes_alike(stored, deq)

    stored, deq = quantize_mixed(state)
    quant = mixed_quant(state)
    write(
        args.out / "qwen3-moe-tiny-modelopt-mixed",
        stored,
        dict(quant, quant_method="modelopt"),
        quant,
        deq,
        ids,
        shared,
    )


if __name__ == "__main__":
    main()
