#!/usr/bin/env bash
# sparkrt's CPU backend and llama.cpp's CPU build side by side, in one run,
# on the same weights and thread count (issue 4's speed check).
#
#   scripts/bench-vs-llamacpp.sh LLAMA_BENCH MODEL_DIR MODEL_GGUF [THREADS]
#
# LLAMA_BENCH: a llama-bench binary (llama.cpp built for the CPU; the
# llama-cpp-python source package on PyPI carries its source). MODEL_DIR: a
# safetensors checkpoint (e.g. `sparkrt make-checkpoint --like
# benches/models/qwen3-30b-a3b-8l` or `qwen3.6-35b-a3b-8l`); MODEL_GGUF: the
# same weights as a BF16 GGUF (scripts/gguf-from-checkpoint.py; for a hybrid
# check the converter with scripts/gguf-check.sh first). Prints prefill
# (pp512) and decode (tg64) tok/s of each, medians of 3 repeats, and
# sparkrt ÷ llama.cpp. SPARKRT_ISA picks sparkrt's CPU tier. One round: run
# it several times for interleaved rounds.
set -euo pipefail
cd "$(dirname "$0")/.."

if (($# < 3)); then
	sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
	exit 2
fi
llama_bench="$1"
model_dir="$2"
gguf="$3"
threads="${4:-$(nproc)}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

# Each engine maps its file: read it into the page cache first, so neither
# pays for the other's file having pushed it out (the two may not both fit).
warm() {
	cat "$@" >/dev/null
}

cargo build --release --quiet
warm "$gguf"
echo "llama.cpp: llama-bench -p 512 -n 64 -t $threads -r 3"
"$llama_bench" -m "$gguf" -p 512 -n 64 -t "$threads" -r 3 -o json >"$out/llama.json"
warm "$model_dir"/*.safetensors
echo "sparkrt: bench --prompt-len 512 --gen 64 --threads $threads --repeats 3"
./target/release/sparkrt bench --model "$model_dir" --backend cpu --prompt-len 512 --gen 64 \
	--threads "$threads" --repeats 3 --json >"$out/sparkrt.json"

python3 - "$out/llama.json" "$out/sparkrt.json" <<'PY'
import json, sys
llama = json.load(open(sys.argv[1]))
ours = json.load(open(sys.argv[2]))
# llama-bench reports the mean of its repeats and each sample.
def median(samples):
    s = sorted(samples)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
pp = next(r for r in llama if r["n_prompt"] > 0 and r["n_gen"] == 0)
tg = next(r for r in llama if r["n_gen"] > 0 and r["n_prompt"] == 0)
rows = [
    ("prefill tok/s (pp512)", ours["prefill_tok_s"], median(pp["samples_ts"])),
    ("decode tok/s (tg64)", ours["decode_tok_s"], median(tg["samples_ts"])),
]
print(f"{'':24} {'sparkrt':>10} {'llama.cpp':>10} {'ratio':>7}")
for name, a, b in rows:
    print(f"{name:24} {a:10.1f} {b:10.1f} {a / b:7.2f}")
print(f"sparkrt ({ours['cpu_isa']}) decode roofline {ours['roofline_tok_s']:.1f} tok/s "
      f"({ours['bytes_per_token'] / 1e9:.3f} GB of weights/token at "
      f"{ours['bandwidth_bytes_s'] / 1e9:.1f} GB/s): decode at "
      f"{100 * ours['decode_tok_s'] / ours['roofline_tok_s']:.0f}%; "
      f"peak RSS {ours['peak_rss_bytes'] / 2**30:.2f} GiB")
model = ours["perf_model"]
if model.get("decode_bandwidth_fraction") is not None:
    # Weights, the KV read at the mean context and the recurrent state read
    # and written (hybrids): everything a decode step moves.
    print(f"sparkrt decode moves {model['weight_bytes_per_step'] / 1e6:.1f} MB weights + "
          f"{model['kv_bytes_per_step'] / 1e6:.1f} MB KV + "
          f"{model['state_bytes_per_step'] / 1e6:.1f} MB state a token: "
          f"{100 * model['decode_bandwidth_fraction']:.0f}% of the read bandwidth")
PY
