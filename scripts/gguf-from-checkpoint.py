#!/usr/bin/env python3
"""Writes a llama.cpp GGUF of a qwen3_moe BF16 safetensors checkpoint made by
`sparkrt make-checkpoint` (the bench models), for the side-by-side
benchmarks (scripts/bench-vs-llamacpp.sh, scripts/cold-start.sh).

    scripts/gguf-from-checkpoint.py MODEL_DIR OUT.gguf [--gguf-py DIR]

The bench models have random weights and no tokenizer, so the GGUF gets a
placeholder SentencePiece vocabulary of the config's size (the three control
tokens, the 256 byte tokens, then filler pieces): llama.cpp loads and runs
it, and its text means nothing, as sparkrt's output on the same weights.
Tensors are copied one at a time (each layer's experts stacked into one
tensor, as llama.cpp wants), so memory stays at about one layer's experts.
`--gguf-py` points at the `gguf-py` folder of the llama.cpp source being
benchmarked (its writer matches that build); otherwise the `gguf` package.
"""

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np


def tensors_of(model_dir: Path) -> dict:
    """Name -> (file, dtype, shape, byte offset) over every shard."""
    found = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        with open(shard, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
        base = 8 + header_len
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, _ = info["data_offsets"]
            found[name] = (shard, info["dtype"], tuple(info["shape"]), base + begin)
    return found


def load(entry) -> np.ndarray:
    """The tensor's raw elements (bf16 as uint16), memory-mapped."""
    shard, dtype, shape, offset = entry
    np_dtype = {"BF16": np.uint16, "F32": np.float32}[dtype]
    return np.memmap(shard, dtype=np_dtype, mode="r", offset=offset, shape=shape)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--gguf-py", type=Path, help="llama.cpp's gguf-py folder")
    args = parser.parse_args()
    if args.gguf_py:
        sys.path.insert(0, str(args.gguf_py))
    import gguf

    config = json.loads((args.model_dir / "config.json").read_text())
    if config.get("model_type") != "qwen3_moe":
        print(f"{args.model_dir}: only qwen3_moe checkpoints are converted", file=sys.stderr)
        return 2
    found = tensors_of(args.model_dir)
    layers = config["num_hidden_layers"]
    experts = config["num_experts"]

    # (GGUF name, source names, stacked?) in llama.cpp's order.
    plan = [("token_embd.weight", ["model.embed_tokens.weight"])]
    for i in range(layers):
        p = f"model.layers.{i}"
        plan += [
            (f"blk.{i}.attn_norm.weight", [f"{p}.input_layernorm.weight"]),
            (f"blk.{i}.attn_q.weight", [f"{p}.self_attn.q_proj.weight"]),
            (f"blk.{i}.attn_k.weight", [f"{p}.self_attn.k_proj.weight"]),
            (f"blk.{i}.attn_v.weight", [f"{p}.self_attn.v_proj.weight"]),
            (f"blk.{i}.attn_output.weight", [f"{p}.self_attn.o_proj.weight"]),
            (f"blk.{i}.attn_q_norm.weight", [f"{p}.self_attn.q_norm.weight"]),
            (f"blk.{i}.attn_k_norm.weight", [f"{p}.self_attn.k_norm.weight"]),
            (f"blk.{i}.ffn_norm.weight", [f"{p}.post_attention_layernorm.weight"]),
            (f"blk.{i}.ffn_gate_inp.weight", [f"{p}.mlp.gate.weight"]),
        ]
        for ours, theirs in [("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")]:
            names = [f"{p}.mlp.experts.{e}.{theirs}.weight" for e in range(experts)]
            plan.append((f"blk.{i}.ffn_{ours}_exps.weight", names))
    plan += [("output_norm.weight", ["model.norm.weight"])]
    if not config.get("tie_word_embeddings", False):
        plan += [("output.weight", ["lm_head.weight"])]
    missing = [n for _, names in plan for n in names if n not in found]
    if missing:
        print(f"{args.model_dir}: missing tensors, e.g. {missing[0]}", file=sys.stderr)
        return 2

    writer = gguf.GGUFWriter(args.out, "qwen3moe")
    writer.add_name(args.model_dir.name)
    writer.add_block_count(layers)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_expert_count(experts)
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)

    vocab = config["vocab_size"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    tokens += [f"\u2581t{i}" for i in range(vocab - len(tokens))]
    types += [gguf.TokenType.NORMAL] * (vocab - len(types))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)

    def kept_f32(name: str, shape) -> bool:
        # llama.cpp's CPU ops take norms and the router only in f32 (as its
        # own converter writes them).
        return len(shape) == 1 or name.endswith("ffn_gate_inp.weight")

    def shape_and_type(name, names):
        _, dtype, shape, _ = found[names[0]]
        if kept_f32(name, shape):
            dtype = "F32"
        full = (len(names), *shape) if len(names) > 1 else shape
        element = {"BF16": 2, "F32": 4}[dtype]
        return full, dtype, int(np.prod(full)) * element

    for name, names in plan:
        shape, dtype, nbytes = shape_and_type(name, names)
        if dtype == "BF16":
            # Raw bf16 bytes: the byte shape's last axis is twice the elements'.
            byte_shape = (*shape[:-1], shape[-1] * 2)
            writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes,
                                   raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            writer.add_tensor_info(name, shape, np.dtype(np.float32), nbytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for done, (name, names) in enumerate(plan, 1):
        parts = [load(found[n]) for n in names]
        data = np.stack(parts) if len(parts) > 1 else np.asarray(parts[0])
        if data.dtype == np.uint16 and kept_f32(name, data.shape):
            # bf16 is the high half of an f32.
            data = (data.astype(np.uint32) << 16).view(np.float32)
        elif data.dtype == np.uint16:
            data = data.view(np.uint8)
        writer.write_tensor_data(data)
        print(f"\r{done}/{len(plan)} tensors", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
