#!/usr/bin/env python3
"""Self-distils the MTP head of a fixture made by make-mtp-fixture.py, for
benchmarks: a head whose drafts are mostly right, where the fixture's random
head is mostly wrong.

  python3 scripts/distill-mtp-head.py [--fixture qwen35-tiny-mtp] --out DIR

The target greedily continues random prompts (what `sparkrt bench` runs);
with `--bench-prompt-len N` it continues only `sparkrt bench`'s own batch-1
prompt of N tokens (SplitMix64, seed 42), so that the head is right on that
workload (the tiny targets' continuations are too arbitrary for a one-layer
head to generalise: held-out top-1 is printed);
the head (fc, its norms and its decoder layer; embed and lm_head are the
target's, frozen) learns to predict the token two positions on from the
target's last hidden state and the next token, with the wiring
make-mtp-fixture.py writes down. DIR gets the fixture with the trained
`mtp.*` tensors (bf16). Nothing of it is committed: it is a benchmark input.
Then:

  python3 scripts/distill-mtp-head.py --out DIR --bench-prompt-len 128
  SPEC='{"method": "mtp", "num_speculative_tokens": 1}' \\
    scripts/spec-decode-bench.sh DIR 5 --prompt-len 128 --gen 128
"""

import argparse
import importlib.util
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parent.parent
HELD_OUT = 16
spec = importlib.util.spec_from_file_location("fixture", ROOT / "scripts" / "make-mtp-fixture.py")
fixture = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fixture)


def bench_prompt(length, vocab):
    """`sparkrt bench`'s batch-1 random prompt (src/util/rng.rs SplitMix64, seed 42)."""
    mask, state, out = (1 << 64) - 1, 42, []
    for _ in range(length):
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        out.append((z ^ (z >> 31)) % vocab)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixture", default="qwen35-tiny-mtp",
                        choices=[f"{t}-mtp" for t in fixture.TARGETS])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--gen", type=int, default=160)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--bench-prompt-len", type=int)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    src = ROOT / "tests" / "fixtures" / args.fixture
    model_class, layer_class = fixture.TARGETS[args.fixture.removesuffix("-mtp")]
    model = model_class.from_pretrained(src, dtype=torch.float32, attn_implementation="eager").eval()
    text = model.config.text_config
    lm = model.model.language_model
    vocab, eps = text.vocab_size, text.rms_norm_eps

    # The target's greedy continuations and its last hidden states over them.
    with torch.no_grad():
        # The last HELD_OUT continuations only check the trained head.
        if args.bench_prompt_len:
            args.prompt_len = args.bench_prompt_len
        prompts = torch.randint(0, vocab, (args.prompts + HELD_OUT, args.prompt_len))
        if args.bench_prompt_len:
            prompts[: args.prompts] = torch.tensor(bench_prompt(args.prompt_len, vocab))
        ids = model.generate(prompts, max_new_tokens=args.gen, do_sample=False,
                             min_new_tokens=args.gen, pad_token_id=0)
        hidden = lm(input_ids=ids).last_hidden_state.float()
    print("target continuations", tuple(ids.shape))

    weights = load_file(src / "model.safetensors")
    head = {k: v.float().clone().requires_grad_(True) for k, v in weights.items() if k.startswith("mtp.")}
    layer = layer_class(text, text.layer_types.index("full_attention")).float()
    layer_state = {k.removeprefix("mtp.layers.0."): v for k, v in head.items() if k.startswith("mtp.layers.0.")}
    # Stacked experts (MoE) are not handled here: distil the dense fixture.
    layer.load_state_dict({k: v.detach() for k, v in layer_state.items()})
    params = [p for k, p in head.items() if not k.startswith("mtp.layers.0.")] + list(layer.parameters())
    optimiser = torch.optim.Adam(params, lr=2e-3)
    embed, lm_head = lm.embed_tokens.weight.detach(), model.lm_head.weight.detach()
    t = ids.shape[1] - 2
    pos = torch.arange(t)
    mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
    def head_logits(batch):
        e = fixture.zero_centred(head["mtp.pre_fc_norm_embedding.weight"], embed[ids[batch, 1:t + 1]], eps)
        h = fixture.zero_centred(head["mtp.pre_fc_norm_hidden.weight"], hidden[batch, :t], eps)
        x = torch.cat([e, h], dim=-1) @ head["mtp.fc.weight"].T
        cos_sin = lm.rotary_emb(x, pos[None, None, :].expand(3, x.shape[0], t))
        y = layer(x, position_embeddings=cos_sin, attention_mask=mask, position_ids=pos[None])
        y = y[0] if isinstance(y, tuple) else y
        return fixture.zero_centred(head["mtp.norm.weight"], y, eps) @ lm_head.T

    for step in range(args.steps):
        batch = torch.randint(0, args.prompts, (8,))
        logits = head_logits(batch)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), ids[batch, 2:t + 2].reshape(-1))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        if step % 50 == 0 or step == args.steps - 1:
            right = (logits.argmax(-1) == ids[batch, 2:t + 2]).float().mean()
            print(f"step {step}: loss {loss.item():.3f}, top-1 right {right.item():.2f}")
    with torch.no_grad():
        held = torch.arange(args.prompts, args.prompts + HELD_OUT)
        right = (head_logits(held).argmax(-1) == ids[held, 2:t + 2])[:, args.prompt_len:]
        print(f"held-out continuations: top-1 right {right.float().mean().item():.2f}")

    trained = {k: v.detach() for k, v in head.items() if not k.startswith("mtp.layers.0.")}
    trained.update({f"mtp.layers.0.{k}": v.detach() for k, v in layer.state_dict().items()})
    assert trained.keys() == head.keys()
    weights.update({k: v.to(torch.bfloat16).contiguous() for k, v in trained.items()})
    shutil.rmtree(args.out, ignore_errors=True)
    shutil.copytree(src, args.out)
    save_file(weights, args.out / "model.safetensors", metadata={"format": "pt"})
    print("wrote", args.out)


if __name__ == "__main__":
    main()
