#!/usr/bin/env python3
"""Writes the tiny Qwen3.5 / Qwen3-Next reference checkpoints of tests/fixtures.

  python3 scripts/make-qwen35-fixtures.py [--out tests/fixtures]

Needs transformers 5.24 and torch (CPU). Each folder is a checkpoint in the
hub layout with random bf16 weights (fixed seeds) and the oracle's outputs,
as the shared fixtures (see tests/fixtures/README.md):

- `qwen3-next-tiny`: `Qwen3NextForCausalLM`, the fused `in_proj_qkvz` /
  `in_proj_ba` projections (grouped by key head), two value heads per key
  head, per-expert tensors.
- `qwen35-moe-tiny-r4`: `Qwen3_5MoeForConditionalGeneration` with four value
  heads per key head, key heads wider than value heads, f32 `A_log` and
  `dt_bias`, the experts stacked as Qwen publishes them
  (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I])
  and the weights in two shards with an index. The stacked layout is read
  back by transformers before the reference is computed, so the layout is
  the one transformers reads.

`reference.safetensors` holds `input_ids`, `logits` (f32, every position),
`greedy_ids` (24 tokens, no EOS stop) and the same for the 150-token
`long_*` prompt; the prompts are those of the shared `qwen35-moe-tiny`
fixture. The oracle runs in float32 over the stored values, with
transformers' torch fallbacks for the convolution and the delta rule.
"""

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

import transformers

GREEDY_TOKENS = 24
ROOT = Path(__file__).resolve().parent.parent


def text_config(**over):
    base = dict(
        vocab_size=512,
        hidden_size=128,
        num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_conv_kernel_dim=4,
        num_experts=16,
        num_experts_per_tok=4,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=511,
    )
    base.update(over)
    return base


def scale_weights(model, seed):
    """Random weights large enough that greedy decoding has a clear winner:
    the decoder's norms around 0 (zero-centred), gates and decays spread."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "visual" in name:
                p.normal_(0.0, 0.02, generator=g)
            elif name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(0.01, 4.0, generator=g).log())
            elif name.endswith("dt_bias"):
                p.normal_(0.0, 0.5, generator=g)
            elif "linear_attn.norm" in name:
                p.normal_(1.0, 0.1, generator=g)
            elif "norm" in name:
                p.normal_(0.0, 0.1, generator=g)
            elif name.endswith("conv1d.weight"):
                p.normal_(0.0, 0.3, generator=g)
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0, generator=g)
            elif p.dim() >= 2:
                fan_in = p.shape[-1]
                p.normal_(0.0, 1.0 / fan_in**0.5, generator=g)


def greedy(model, ids):
    out = ids.clone()
    with torch.no_grad():
        for _ in range(GREEDY_TOKENS):
            logits = model(input_ids=out[None]).logits[0, -1]
            out = torch.cat([out, logits.argmax().reshape(1)])
    return out[len(ids):]


def margin(logits):
    top = logits.topk(2, dim=-1).values
    return float((top[:, 0] - top[:, 1]).min())


def reference(model, prompts, folder, oracle):
    tensors, info = {}, {"oracle": oracle}
    for prefix, ids in prompts.items():
        with torch.no_grad():
            logits = model(input_ids=ids[None]).logits[0].float()
        tensors[f"{prefix}input_ids"] = ids
        tensors[f"{prefix}logits"] = logits.contiguous()
        tensors[f"{prefix}greedy_ids"] = greedy(model, ids)
        info[f"{prefix}input_ids"] = ids.tolist()
        info[f"{prefix}greedy_ids"] = tensors[f"{prefix}greedy_ids"].tolist()
        info[f"{prefix}min_top1_margin"] = margin(logits)
    save_file(tensors, folder / "reference.safetensors")
    (folder / "reference.json").write_text(json.dumps(info, indent=1) + "\n")


def companions(src, folder):
    for name in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(src / name, folder / name)
    (folder / "generation_config.json").write_text(
        json.dumps({"eos_token_id": 511, "do_sample": False}, indent=2) + "\n"
    )


def stack_experts(folder, layers, experts, prefix):
    """Rewrites the per-expert tensors of `folder` stacked per layer, in two
    shards with an index."""
    state = {}
    for f in sorted(folder.glob("*.safetensors")):
        state.update(load_file(f))
        f.unlink()
    index = folder / "model.safetensors.index.json"
    if index.exists():
        index.unlink()
    for layer in range(layers):
        base = f"{prefix}.layers.{layer}.mlp.experts"
        gate = [state.pop(f"{base}.{e}.gate_proj.weight") for e in range(experts)]
        up = [state.pop(f"{base}.{e}.up_proj.weight") for e in range(experts)]
        down = [state.pop(f"{base}.{e}.down_proj.weight") for e in range(experts)]
        state[f"{base}.gate_up_proj"] = torch.stack(
            [torch.cat([g, u], dim=0) for g, u in zip(gate, up)]
        ).contiguous()
        state[f"{base}.down_proj"] = torch.stack(down).contiguous()
    names = sorted(state)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate([names[:half], names[half:]]):
        file = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({n: state[n] for n in part}, folder / file, metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    total = sum(t.numel() * t.element_size() for t in state.values())
    index.write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
        + "\n"
    )


def qwen3_next(out, prompts, shared):
    folder = out / "qwen3-next-tiny"
    shutil.rmtree(folder, ignore_errors=True)
    torch.manual_seed(1)
    config = transformers.Qwen3NextConfig(
        **text_config(
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=32,
            linear_value_head_dim=32,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10_000_000.0,
                "partial_rotary_factor": 0.25,
            },
            norm_topk_prob=True,
            intermediate_size=256,
        )
    )
    model = transformers.Qwen3NextForCausalLM(config)
    scale_weights(model, 1)
    model.to(torch.bfloat16).save_pretrained(folder)
    companions(shared, folder)
    model = transformers.Qwen3NextForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    reference(model, prompts, folder, "transformers Qwen3NextForCausalLM, float32, torch fallbacks")


def qwen35_moe_r4(out, prompts, shared):
    folder = out / "qwen35-moe-tiny-r4"
    shutil.rmtree(folder, ignore_errors=True)
    torch.manual_seed(2)
    shared_config = json.loads((shared / "config.json").read_text())
    text = text_config(
        linear_num_key_heads=1,
        linear_num_value_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=16,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [4, 2, 2],
            "mrope_interleaved": True,
        },
    )
    config = transformers.Qwen3_5MoeConfig(
        text_config=text,
        vision_config=shared_config["vision_config"],
        tie_word_embeddings=False,
    )
    model = transformers.Qwen3_5MoeForConditionalGeneration(config)
    scale_weights(model, 2)
    model.to(torch.bfloat16)
    for layer in model.model.language_model.layers:
        if hasattr(layer, "linear_attn"):
            layer.linear_attn.A_log.data = layer.linear_attn.A_log.data.float()
            layer.linear_attn.dt_bias.data = layer.linear_attn.dt_bias.data.float()
    model.save_pretrained(folder)
    stack_experts(folder, text["num_hidden_layers"], text["num_experts"], "model.language_model")
    companions(shared, folder)
    model = transformers.Qwen3_5MoeForConditionalGeneration.from_pretrained(
        folder, dtype=torch.float32
    ).eval()
    reference(
        model,
        prompts,
        folder,
        "transformers Qwen3_5MoeForConditionalGeneration, float32, torch fallbacks, stacked experts read back",
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures")
    args = parser.parse_args()
    shared = args.out / "qwen35-moe-tiny"
    ref = load_file(shared / "reference.safetensors")
    prompts = {"": ref["input_ids"], "long_": ref["long_input_ids"]}
    torch.set_num_threads(2)
    qwen3_next(args.out, prompts, shared)
    qwen35_moe_r4(args.out, prompts, shared)


if __name__ == "__main__":
    main()
