#!/usr/bin/env bash
# The CUDA backend's check on a machine with an NVIDIA GPU (issue 5), in one
# go and in under 8 minutes: a release build; the kernels compiled for this
# GPU with their registers and spills; the CUDA tests (every kernel against
# the CPU backend, the fixtures against the transformers references); then
# `sparkrt bench` on CUDA for the bench models (written once with
# `sparkrt make-checkpoint` into $SPARKRT_BENCH_DIR, default
# target/gpu-check-models, and reused on a rerun). Prints every figure and
# exits non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

start=$SECONDS
failed=()
models="${SPARKRT_BENCH_DIR:-target/gpu-check-models}"
sparkrt=./target/release/sparkrt
# The CUDA topics of the one integration-test binary (tests/main.rs).
cuda_tests=(cuda_kernels:: cuda_fixtures:: cuda_nvrtc:: cuda_fallback::)

step() {
	printf '\n== %s [%ds]\n' "$1" $((SECONDS - start))
}

# Runs a step's command; a failure is recorded and the next steps still run.
run() {
	local name="$1"
	shift
	step "$name"
	if ! "$@"; then
		failed+=("$name")
	fi
}

step "GPU"
nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader ||
	echo "nvidia-smi not found"

run "release build" cargo build --release --quiet
run "test binaries" cargo test --release --quiet --no-run --test integration
run "kernels for this GPU (NVRTC, registers, spills)" "$sparkrt" kernels

# The tests print their figures (logit differences, weights residency).
cuda_test_run() {
	cargo test --release --test integration -- "${cuda_tests[@]}" --nocapture --test-threads 1 2>&1 |
		grep -E '^test |differ|residency|skipping|panicked|test result'
	return "${PIPESTATUS[0]}"
}
run "CUDA tests" cuda_test_run

for model in qwen3-30b-a3b-8l gpt-oss-120b-4l; do
	if [[ ! -f "$models/$model/model.safetensors" && ! -f "$models/$model/model.safetensors.index.json" ]]; then
		rm -rf "${models:?}/$model"
		run "write $model" "$sparkrt" make-checkpoint --like "benches/models/$model" --out "$models/$model"
	fi
done

run "bench qwen3-30b-a3b-8l, batch 1" \
	"$sparkrt" bench --model "$models/qwen3-30b-a3b-8l" --backend cuda --prompt-len 512 --gen 64 --repeats 2
run "bench qwen3-30b-a3b-8l, batch 32" \
	"$sparkrt" bench --model "$models/qwen3-30b-a3b-8l" --backend cuda --prompt-len 128 --gen 64 --repeats 1 --batch 32
run "bench gpt-oss-120b-4l, batch 1" \
	"$sparkrt" bench --model "$models/gpt-oss-120b-4l" --backend cuda --prompt-len 512 --gen 64 --repeats 2

step "done"
if ((${#failed[@]} > 0)); then
	printf 'FAILED: %s\n' "${failed[@]}"
	exit 1
fi
echo "all steps passed"
