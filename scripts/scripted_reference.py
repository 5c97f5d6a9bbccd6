#!/usr/bin/env python3
"""An independent reading of a scripted checkpoint (`make-checkpoint --script`):
transformers loads its config, tokenizer and chat template, numpy runs its
one layer (RMS norm, attention with sinks, the MoE block whose down
projections are zero, the final norm and head) greedily from the template's
generation prompt, and the decoded text is printed as JSON.

Usage: scripted_reference.py DIR MAX_TOKENS

RoPE is left out: the scripted attention sits on RoPE's slowest pair, whose
angle over a short prompt is below 1e-4 rad (the construction's premise; a
rotation that mattered would change the answer here and fail the test).
"""

import json
import struct
import sys

import numpy as np
from transformers import AutoConfig, AutoTokenizer


def load(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])
    tensors = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        start, end = v["data_offsets"]
        raw = data[8 + n + start : 8 + n + end]
        if v["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif v["dtype"] == "F32":
            a = np.frombuffer(raw, dtype=np.float32)
        else:
            a = np.frombuffer(raw, dtype=np.uint8)
        tensors[name] = a.reshape(v["shape"]) if v["shape"] else a
    return tensors


def rms(x, weight, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def main():
    directory, max_tokens = sys.argv[1], int(sys.argv[2])
    config = AutoConfig.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    w = load(directory + "/model.safetensors")
    eps, hd = config.rms_norm_eps, config.head_dim
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    prefix = "model.layers.0."
    bias = lambda name, rows: w.get(prefix + name + ".bias", np.zeros(rows, np.float32))
    out = []
    for _ in range(max_tokens):
        x = w["model.embed_tokens.weight"][ids]
        a = rms(x, w[prefix + "input_layernorm.weight"], eps)
        q = a @ w[prefix + "self_attn.q_proj.weight"].T + bias("self_attn.q_proj", heads * hd)
        k = a @ w[prefix + "self_attn.k_proj.weight"].T + bias("self_attn.k_proj", kv_heads * hd)
        v = a @ w[prefix + "self_attn.v_proj.weight"].T + bias("self_attn.v_proj", kv_heads * hd)
        q = q.reshape(len(ids), heads, hd)
        k = k.reshape(len(ids), kv_heads, hd)
        v = v.reshape(len(ids), kv_heads, hd)
        if prefix + "self_attn.q_norm.weight" in w:
            q = rms(q, w[prefix + "self_attn.q_norm.weight"], eps)
            k = rms(k, w[prefix + "self_attn.k_norm.weight"], eps)
        group = heads // kv_heads
        last = np.zeros((heads, hd), np.float32)
        for h in range(heads):
            scores = k[:, h // group] @ q[-1, h] / np.sqrt(hd)
            logits = scores
            if prefix + "self_attn.sinks" in w:
                logits = np.append(scores, w[prefix + "self_attn.sinks"][h])
            p = np.exp(logits - logits.max())
            p = p / p.sum()
            last[h] = p[: len(ids)] @ v[:, h // group]
        o = last.reshape(-1) @ w[prefix + "self_attn.o_proj.weight"].T
        o = o + bias("self_attn.o_proj", o.shape[0])
        # The MoE block's down projections are zero (checked below): it adds nothing.
        h_last = x[-1] + o
        final = rms(h_last, w["model.norm.weight"], eps)
        token = int(np.argmax(w["lm_head.weight"] @ final))
        out.append(token)
        ids.append(token)
        if token in eos:
            break
    zero_down = all(
        not np.any(t) for n, t in w.items() if "down_proj" in n and not n.endswith("_scales")
    )
    print(json.dumps({"text": tokenizer.decode(out, skip_special_tokens=False),
                      "down_projections_zero": zero_down}))


if __name__ == "__main__":
    main()
