#!/usr/bin/env python3
"""Writes tests/fixtures/qwen35-moe-tiny-mtp: the tiny Qwen3.5 MoE checkpoint
with an MTP head (`mtp.*` tensors, `mtp_num_hidden_layers: 1`) and the MTP
head's reference outputs.

  python3 scripts/make-mtp-fixture.py [--out tests/fixtures] [--target qwen35-moe-tiny|qwen35-tiny]

writes `<target>-mtp` beside the target fixture (both are committed).

Needs transformers 5.24 and torch (CPU). The target is the `qwen35-moe-tiny`
fixture's checkpoint, unchanged (transformers ignores `mtp.*`); the MTP head
gets random bf16 weights (fixed seed). The reference is written here from
vLLM's `qwen3_5_mtp.py` wiring, with transformers' own decoder layer for the
MTP layer (a full-attention layer, MoE with a shared expert):

  e = pre_fc_norm_embedding(embed(x[t+1]))     h = pre_fc_norm_hidden(H[t])
  y = norm(layer(fc([e | h]), position t))      logits = lm_head(y)

where H[t] is the target's last hidden state at position t, after its final
norm (what the target's lm_head reads). Applied recursively (k > 1), H is the
MTP head's own output y of the position before, and x the draft just made.
Every norm is zero-centred (`1 + w`), embed and lm_head are the target's.

`reference.safetensors` adds to the target's reference:
- `mtp_logits` (f32 [T, V]): the MTP head at every prompt position t, fed
  `H[t]` and the next token (the prompt's, then the target's greedy first token);
- `mtp_chain` (i64 [3]): three drafts made recursively after the prompt, the
  first from position T-1, each next one at the following position.
"""

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

import transformers

ROOT = Path(__file__).resolve().parent.parent
CHAIN = 3
# Target fixture: its model class and the decoder layer the MTP layer is.
TARGETS = {
    "qwen35-moe-tiny": (
        transformers.Qwen3_5MoeForConditionalGeneration,
        transformers.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeDecoderLayer,
    ),
    "qwen35-tiny": (
        transformers.Qwen3_5ForConditionalGeneration,
        transformers.models.qwen3_5.modeling_qwen3_5.Qwen3_5DecoderLayer,
    ),
}


def zero_centred(w, x, eps):
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x * (1.0 + w.float())


def mtp_weights(text, layer_keys, seed):
    """Random MTP weights: the layer's tensors named as transformers names a
    decoder layer's, under `mtp.layers.0.`."""
    g = torch.Generator().manual_seed(seed)
    h = text.hidden_size
    out = {
        "mtp.fc.weight": torch.randn(h, 2 * h, generator=g) / (2 * h) ** 0.5,
        "mtp.pre_fc_norm_embedding.weight": torch.randn(h, generator=g) * 0.1,
        "mtp.pre_fc_norm_hidden.weight": torch.randn(h, generator=g) * 0.1,
        "mtp.norm.weight": torch.randn(h, generator=g) * 0.1,
    }
    for name, shape in layer_keys.items():
        if "norm" in name:
            t = torch.randn(shape, generator=g) * 0.1
        else:
            t = torch.randn(shape, generator=g) / shape[-1] ** 0.5
        out[f"mtp.layers.0.{name}"] = t
    return {k: v.to(torch.bfloat16).contiguous() for k, v in out.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures")
    parser.add_argument("--target", choices=sorted(TARGETS), default="qwen35-moe-tiny")
    args = parser.parse_args()
    torch.set_num_threads(2)
    src = args.out / args.target
    folder = args.out / f"{args.target}-mtp"
    model_class, layer_class = TARGETS[args.target]
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    for name in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
        shutil.copy(src / name, folder / name)
    config = json.loads((src / "config.json").read_text())
    config["text_config"]["mtp_num_hidden_layers"] = 1
    config["text_config"]["mtp_use_dedicated_embeddings"] = False
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    model = model_class.from_pretrained(
        src, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    text = model.config.text_config
    lm = model.model.language_model
    full = text.layer_types.index("full_attention")
    layer = layer_class(text, full).eval()
    # The MTP layer's tensors as a checkpoint names them: one per expert
    # (a dense MLP's as transformers names them).
    keys = {}
    for name, p in layer.state_dict().items():
        if name == "mlp.experts.gate_up_proj":
            e, two_i, _ = p.shape
            for x in range(e):
                keys[f"mlp.experts.{x}.gate_proj.weight"] = (two_i // 2, p.shape[2])
                keys[f"mlp.experts.{x}.up_proj.weight"] = (two_i // 2, p.shape[2])
        elif name == "mlp.experts.down_proj":
            for x in range(p.shape[0]):
                keys[f"mlp.experts.{x}.down_proj.weight"] = tuple(p.shape[1:])
        else:
            keys[name.removesuffix(".weight") + ".weight" if name.endswith(".weight") else name] = tuple(p.shape)
    mtp = mtp_weights(text, keys, seed=7)

    # Load them into the transformers layer (experts stacked as it holds them).
    state = {}
    for name in layer.state_dict():
        if name == "mlp.experts.gate_up_proj":
            state[name] = torch.stack([
                torch.cat([mtp[f"mtp.layers.0.mlp.experts.{x}.gate_proj.weight"],
                           mtp[f"mtp.layers.0.mlp.experts.{x}.up_proj.weight"]])
                for x in range(text.num_experts)]).float()
        elif name == "mlp.experts.down_proj":
            state[name] = torch.stack([
                mtp[f"mtp.layers.0.mlp.experts.{x}.down_proj.weight"]
                for x in range(text.num_experts)]).float()
        else:
            state[name] = mtp[f"mtp.layers.0.{name}"].float()
    layer.load_state_dict(state)

    weights = load_file(src / "model.safetensors")
    weights.update(mtp)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})

    ref = load_file(src / "reference.safetensors")
    ids = ref["input_ids"]
    first = int(ref["greedy_ids"][0])
    eps = text.rms_norm_eps
    f = {k: v.float() for k, v in mtp.items()}
    embed = lm.embed_tokens.weight
    lm_head = model.lm_head.weight

    def fc_input(hidden, next_ids):
        """The head's layer input: fc([embedding_norm(embed(next)) | hidden_norm(hidden)])."""
        e = zero_centred(f["mtp.pre_fc_norm_embedding.weight"], embed[next_ids], eps)
        h = zero_centred(f["mtp.pre_fc_norm_hidden.weight"], hidden, eps)
        x = torch.cat([e, h], dim=-1) @ f["mtp.fc.weight"].T
        return x

    with torch.no_grad():
        out = lm(input_ids=ids[None], output_hidden_states=False)
        target_hidden = out.last_hidden_state[0].float()  # after the final norm
        # Every prompt position, fed the next token (the greedy first one last).
        next_ids = torch.cat([ids[1:], torch.tensor([first])])
        hidden = target_hidden
        chain = []
        # Rows are computed all at once with a causal mask: the chain's rows
        # follow the prompt's, each a position later.
        rows_hidden = [hidden]
        rows_next = [next_ids]
        logits_all = None
        for step in range(CHAIN + 1):
            hs = torch.cat(rows_hidden)
            nx = torch.cat(rows_next)
            x = fc_input(hs, nx)
            t = x.shape[0]
            pos = torch.arange(t)
            pos3 = pos[None, None, :].expand(3, 1, t)
            cos_sin = lm.rotary_emb(x[None], pos3)
            mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
            y = layer(
                x[None],
                position_embeddings=cos_sin,
                attention_mask=mask,
                position_ids=pos[None],
            )
            y = y[0] if isinstance(y, tuple) else y
            y = zero_centred(f["mtp.norm.weight"], y[0], eps)
            logits = y @ lm_head.T
            if step == 0:
                logits_all = logits.clone()
            if step == CHAIN:
                break
            draft = int(logits[-1].argmax())
            chain.append(draft)
            rows_hidden.append(y[-1:])
            rows_next.append(torch.tensor([draft]))

    tensors = dict(ref)
    tensors["mtp_logits"] = logits_all.contiguous()
    tensors["mtp_chain"] = torch.tensor(chain, dtype=torch.int64)
    save_file(tensors, folder / "reference.safetensors")
    info = json.loads((src / "reference.json").read_text())
    info["mtp_oracle"] = (
        f"vLLM qwen3_5_mtp.py wiring over transformers {layer_class.__name__}, float32, eager attention"
    )
    info["mtp_chain"] = chain
    top = logits_all.topk(2, dim=-1).values
    info["mtp_min_top1_margin"] = float((top[:, 0] - top[:, 1]).min())
    (folder / "reference.json").write_text(json.dumps(info, indent=1) + "\n")
    print("wrote", folder, "chain", chain, "margin", info["mtp_min_top1_margin"])


if __name__ == "__main__":
    main()
