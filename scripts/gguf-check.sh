#!/usr/bin/env bash
# Holds scripts/gguf-from-checkpoint.py's GGUF against transformers: converts
# a fixture with reference logits (../shared/fixtures/qwen35-moe-tiny,
# qwen35-tiny), runs it through llama.cpp's own library and prints the
# logit differences and the top-1 agreement per prompt. A side-by-side
# benchmark on a converted bench model is only a comparison of the same model
# if this passes for the same architecture.
#
#   scripts/gguf-check.sh LLAMA_CPP_DIR FIXTURE_DIR [TOLERANCE]
#
# LLAMA_CPP_DIR: a llama.cpp source tree built with CMake in build/ (the
# llama-cpp-python source package on PyPI carries one; libllama.so in
# build/bin). FIXTURE_DIR: a checkpoint with reference.json and
# reference.safetensors (input_ids / logits, long_input_ids / long_logits).
# TOLERANCE (default 0.5): the 95th percentile over positions of each
# position's largest |logit difference|. The reference runs in f32; llama.cpp
# rounds activations to bf16 before every bf16 matmul (its vec_dot type for
# bf16 weights), and on the tiny random MoE a near-tie in the router then
# picks another expert at an odd position (one position of 150 moves by ~5 in
# qwen35-moe-tiny), so the bound is on the bulk, not the worst. A wrong
# mapping (value-head order, a norm's + 1) moves every position by whole
# units. Also exits 1 if top-1 agrees at fewer than 95% of positions.
set -euo pipefail
cd "$(dirname "$0")/.."

if (($# < 2)); then
	sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'
	exit 2
fi
llama_dir="$(cd "$1" && pwd)"
fixture="$2"
tolerance="${3:-0.5}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

cc -O2 -o "$out/llamacpp-logits" scripts/llamacpp-logits.c -I "$llama_dir/include" \
	-I "$llama_dir/ggml/include" -L "$llama_dir/build/bin" -lllama -Wl,-rpath,"$llama_dir/build/bin"
python3 scripts/gguf-from-checkpoint.py "$fixture" "$out/model.gguf" --gguf-py "$llama_dir/gguf-py"

python3 - "$fixture" "$out" "$tolerance" <<'PY'
import json, struct, subprocess, sys
from pathlib import Path
import numpy as np

fixture, out, tolerance = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
reference = json.loads((fixture / "reference.json").read_text())
with open(fixture / "reference.safetensors", "rb") as f:
    (size,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(size))
    body = f.read()

def tensor(name):
    info = header[name]
    begin, end = info["data_offsets"]
    return np.frombuffer(body[begin:end], dtype=np.float32).reshape(info["shape"])

failed = False
for ids_key, logits_key in [("input_ids", "logits"), ("long_input_ids", "long_logits")]:
    if ids_key not in reference:
        continue
    ids = reference[ids_key]
    run = subprocess.run([str(out / "llamacpp-logits"), str(out / "model.gguf"), *map(str, ids)],
                         capture_output=True, text=True)
    if run.returncode != 0:
        print(run.stderr[-2000:], file=sys.stderr)
        sys.exit(1)
    ours = np.array(json.loads(run.stdout), dtype=np.float32)
    theirs = tensor(logits_key)
    per_position = np.abs(ours - theirs).max(axis=1)
    p50, p95 = np.percentile(per_position, [50, 95])
    agree = int((ours.argmax(1) == theirs.argmax(1)).sum())
    print(f"{fixture.name} {ids_key} ({len(ids)} tokens): |logit diff| per position "
          f"median {p50:.3f}, p95 {p95:.3f}, max {per_position.max():.3f} "
          f"(max |logit| {np.abs(theirs).max():.2f}); top-1 equal at {agree}/{len(ids)}")
    failed |= bool(p95 > tolerance or agree < 0.95 * len(ids))
print("FAIL" if failed else "ok")
sys.exit(1 if failed else 0)
PY
