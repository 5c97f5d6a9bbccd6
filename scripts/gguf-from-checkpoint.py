#!/usr/bin/env python3
"""Writes a llama.cpp GGUF of a BF16 safetensors checkpoint (qwen3_moe, or the
Qwen3.5 / 3.6 hybrids qwen3_5_moe and qwen3_5), such as the bench models of
`sparkrt make-checkpoint`, for the side-by-side benchmarks
(scripts/bench-vs-llamacpp.sh, scripts/cold-start.sh).

    scripts/gguf-from-checkpoint.py MODEL_DIR OUT.gguf [--gguf-py DIR]

The bench models have random weights and no tokenizer, so the GGUF gets a
placeholder SentencePiece vocabulary of the config's size (the three control
tokens, the 256 byte tokens, then filler pieces): llama.cpp loads and runs
it, and its text means nothing, as sparkrt's output on the same weights.
Tensors are copied one at a time (each layer's experts stacked into one
tensor, as llama.cpp wants), so memory stays at about one layer's experts.

For the hybrids the tensors are changed as llama.cpp's own converter
changes them (its conversion/qwen.py, Qwen3NextModel and
_LinearAttentionVReorderBase): RMSNorm weights other than the gated norm's
get + 1 (llama.cpp's norms are not zero-centred), A_log becomes
A = -exp(A_log), dt_bias becomes the ssm_dt bias, the conv1d kernel loses
its middle axis, and the value heads are reordered from grouped by key head
to tiled (what ggml's broadcasting expects). The names come from the
gguf package's own tensor map. The vision tower and mtp.* are left out.
scripts/gguf-check.sh holds the result against transformers' logits.
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


def as_f32(data: np.ndarray) -> np.ndarray:
    """bf16 (as uint16) or f32 elements as f32: bf16 is the high half of an f32."""
    if data.dtype == np.uint16:
        return (data.astype(np.uint32) << 16).view(np.float32)
    return np.asarray(data, dtype=np.float32)


class Entry:
    """One GGUF tensor: its sources (stacked when several), whether it is
    written as f32 (else bf16), and a change applied to the stacked array."""

    def __init__(self, name, sources, f32=False, change=None, squeeze=False):
        self.name, self.sources, self.f32 = name, sources, f32
        self.change, self.squeeze = change, squeeze

    def shape(self, found):
        shape = found[self.sources[0]][2]
        if self.squeeze:
            shape = tuple(d for d in shape if d != 1)
        return (len(self.sources), *shape) if len(self.sources) > 1 else tuple(shape)

    def data(self, found) -> np.ndarray:
        parts = [load(found[n]) for n in self.sources]
        data = np.stack(parts) if len(parts) > 1 else np.asarray(parts[0])
        if self.squeeze:
            data = data.reshape(self.shape(found))
        if self.f32:
            data = as_f32(data)
        if self.change is not None:
            data = self.change(data)
        return data


def qwen3_moe_plan(config, found):
    """(entries, write_metadata) for qwen3_moe, named by hand."""
    layers = config["num_hidden_layers"]
    experts = config["num_experts"]
    plan = [Entry("token_embd.weight", ["model.embed_tokens.weight"])]
    for i in range(layers):
        p = f"model.layers.{i}"
        plan += [
            Entry(f"blk.{i}.attn_norm.weight", [f"{p}.input_layernorm.weight"], f32=True),
            Entry(f"blk.{i}.attn_q.weight", [f"{p}.self_attn.q_proj.weight"]),
            Entry(f"blk.{i}.attn_k.weight", [f"{p}.self_attn.k_proj.weight"]),
            Entry(f"blk.{i}.attn_v.weight", [f"{p}.self_attn.v_proj.weight"]),
            Entry(f"blk.{i}.attn_output.weight", [f"{p}.self_attn.o_proj.weight"]),
            Entry(f"blk.{i}.attn_q_norm.weight", [f"{p}.self_attn.q_norm.weight"], f32=True),
            Entry(f"blk.{i}.attn_k_norm.weight", [f"{p}.self_attn.k_norm.weight"], f32=True),
            Entry(f"blk.{i}.ffn_norm.weight", [f"{p}.post_attention_layernorm.weight"], f32=True),
            # llama.cpp's CPU ops take the router only in f32 (as its own
            # converter writes it).
            Entry(f"blk.{i}.ffn_gate_inp.weight", [f"{p}.mlp.gate.weight"], f32=True),
        ]
        for ours, theirs in [("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")]:
            names = [f"{p}.mlp.experts.{e}.{theirs}.weight" for e in range(experts)]
            plan.append(Entry(f"blk.{i}.ffn_{ours}_exps.weight", names))
    plan.append(Entry("output_norm.weight", ["model.norm.weight"], f32=True))
    if not config.get("tie_word_embeddings", False):
        plan.append(Entry("output.weight", ["lm_head.weight"]))

    def metadata(writer, gguf):
        writer.add_expert_count(experts)
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
        writer.add_feed_forward_length(config["intermediate_size"])
        writer.add_rope_freq_base(config["rope_theta"])

    return "qwen3moe", plan, metadata


def reorder_v_heads(data, axis, key_heads, per_key, head_dim):
    """Value heads grouped by key head [k0v0 k0v1 .. k1v0 ..] -> tiled
    [k0v0 k1v0 .. k0v1 k1v1 ..] along `axis` (llama.cpp's broadcast order)."""
    shape = data.shape
    split = shape[:axis] + (key_heads, per_key, head_dim) + shape[axis + 1:]
    return np.swapaxes(data.reshape(split), axis, axis + 1).reshape(shape)


def qwen3_5_plan(config, found, gguf):
    """(entries, write_metadata) for qwen3_5_moe / qwen3_5, the names from
    the gguf package's tensor map and the changes of llama.cpp's converter."""
    moe = "num_experts" in config
    arch = gguf.MODEL_ARCH.QWEN35MOE if moe else gguf.MODEL_ARCH.QWEN35
    layers = config["num_hidden_layers"]
    names = gguf.get_tensor_name_map(arch, layers)
    key_heads, value_heads = config["linear_num_key_heads"], config["linear_num_value_heads"]
    key_dim, value_dim = config["linear_key_head_dim"], config["linear_value_head_dim"]
    per_key = value_heads // key_heads
    qk_rows = 2 * key_heads * key_dim

    def tiled(axis, head_dim, skip=0):
        """Reorders the value heads from row (or column) `skip` on."""
        def change(data):
            if per_key == 1:
                return data
            head, tail = np.split(data, [skip], axis=axis)
            return np.concatenate([head, reorder_v_heads(tail, axis, key_heads, per_key, head_dim)], axis=axis)
        return change

    def plus_one(data):
        return data + np.float32(1)

    def minus_exp(data):
        return tiled(0, 1)(-np.exp(data))

    # Our names without the multimodal wrapper's `language_model.`, as the
    # tensor map knows them, and the sources they come from.
    text = {}
    for name in found:
        if name.startswith("model.visual.") or name.startswith("mtp."):
            continue
        text[name.replace("model.language_model.", "model.", 1)] = name

    plan = []

    def add(ours, change=None, f32=False, squeeze=False, sources=None):
        gguf_name = names.get_name(ours, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise KeyError(f"the gguf tensor map has no name for {ours}")
        plan.append(Entry(gguf_name, sources or [text[ours]], f32, change, squeeze))

    add("model.embed_tokens.weight")
    for i in range(layers):
        p = f"model.layers.{i}"
        add(f"{p}.input_layernorm.weight", plus_one, f32=True)
        add(f"{p}.post_attention_layernorm.weight", plus_one, f32=True)
        if config["layer_types"][i] == "linear_attention":
            a = f"{p}.linear_attn"
            add(f"{a}.in_proj_qkv.weight", tiled(0, value_dim, skip=qk_rows))
            add(f"{a}.in_proj_z.weight", tiled(0, value_dim))
            add(f"{a}.in_proj_a.weight", tiled(0, 1))
            add(f"{a}.in_proj_b.weight", tiled(0, 1))
            add(f"{a}.conv1d.weight", tiled(0, value_dim, skip=qk_rows), f32=True, squeeze=True)
            add(f"{a}.A_log", minus_exp, f32=True)
            plan.append(Entry(names.get_name(f"{a}.dt_proj.bias", try_suffixes=(".bias",)),
                              [text[f"{a}.dt_bias"]], True, tiled(0, 1)))
            add(f"{a}.norm.weight", f32=True)  # the gated norm is not zero-centred
            add(f"{a}.out_proj.weight", tiled(1, value_dim))
        else:
            a = f"{p}.self_attn"
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                add(f"{a}.{proj}.weight")
            add(f"{a}.q_norm.weight", plus_one, f32=True)
            add(f"{a}.k_norm.weight", plus_one, f32=True)
        m = f"{p}.mlp"
        if moe:
            add(f"{m}.gate.weight", f32=True)
            for proj in ("gate_proj", "up_proj", "down_proj"):
                experts = [text[f"{m}.experts.{e}.{proj}.weight"] for e in range(config["num_experts"])]
                add(f"{m}.experts.{proj}.weight", sources=experts)
                add(f"{m}.shared_expert.{proj}.weight")
            add(f"{m}.shared_expert_gate.weight", f32=True)
        else:
            for proj in ("gate_proj", "up_proj", "down_proj"):
                add(f"{m}.{proj}.weight")
    add("model.norm.weight", plus_one, f32=True)
    if not config.get("tie_word_embeddings", False):
        add("lm_head.weight")

    def metadata(writer, gguf):
        rope = config["rope_parameters"]
        writer.add_rope_freq_base(rope["rope_theta"])
        writer.add_rope_dimension_count(int(config["head_dim"] * rope.get("partial_rotary_factor", 0.25)))
        writer.add_rope_dimension_sections((list(rope.get("mrope_section", [11, 11, 10])) + [0, 0, 0, 0])[:4])
        writer.add_ssm_conv_kernel(config["linear_conv_kernel_dim"])
        writer.add_ssm_state_size(key_dim)
        writer.add_ssm_group_count(key_heads)
        writer.add_ssm_time_step_rank(value_heads)
        writer.add_ssm_inner_size(value_dim * value_heads)
        writer.add_recurrent_layers([t == "linear_attention" for t in config["layer_types"]])
        if moe:
            writer.add_expert_count(config["num_experts"])
            writer.add_expert_used_count(config["num_experts_per_tok"])
            writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
            writer.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])
        else:
            writer.add_feed_forward_length(config["intermediate_size"])

    return arch, plan, metadata


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
    model_type = config.get("model_type")
    found = tensors_of(args.model_dir)
    try:
        if model_type == "qwen3_moe":
            arch, plan, metadata = qwen3_moe_plan(config, found)
        elif model_type in ("qwen3_5_moe", "qwen3_5"):
            config = {**config, **config.get("text_config", {})}
            arch, plan, metadata = qwen3_5_plan(config, found, gguf)
            arch = gguf.MODEL_ARCH_NAMES[arch]
        else:
            print(f"{args.model_dir}: model_type {model_type} is not converted "
                  "(qwen3_moe, qwen3_5_moe, qwen3_5 are)", file=sys.stderr)
            return 2
    except KeyError as missing:
        print(f"{args.model_dir}: missing tensor {missing}", file=sys.stderr)
        return 2
    missing = [n for entry in plan for n in entry.sources if n not in found]
    if missing:
        print(f"{args.model_dir}: missing tensors, e.g. {missing[0]}", file=sys.stderr)
        return 2

    writer = gguf.GGUFWriter(args.out, arch)
    writer.add_name(args.model_dir.name)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    metadata(writer, gguf)
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

    for entry in plan:
        shape = entry.shape(found)
        count = int(np.prod(shape))
        if entry.f32:
            writer.add_tensor_info(entry.name, shape, np.dtype(np.float32), count * 4)
        else:
            # Raw bf16 bytes: the byte shape's last axis is twice the elements'.
            byte_shape = (*shape[:-1], shape[-1] * 2)
            writer.add_tensor_info(entry.name, byte_shape, np.dtype(np.uint8), count * 2,
                                   raw_dtype=gguf.GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for done, entry in enumerate(plan, 1):
        data = entry.data(found)
        if entry.f32:
            data = np.ascontiguousarray(data, dtype=np.float32)
        elif data.dtype == np.uint16:
            data = np.ascontiguousarray(data).view(np.uint8)
        else:
            print(f"{entry.sources[0]}: {data.dtype} is not bf16", file=sys.stderr)
            return 2
        writer.write_tensor_data(data)
        print(f"\r{done}/{len(plan)} tensors", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
