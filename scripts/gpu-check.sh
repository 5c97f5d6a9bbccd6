#!/usr/bin/env bash
# The CUDA backend's check on a machine with an NVIDIA GPU (issue 5), in one
# go (meant to fit 15 minutes on an H200 or a GB10): a release build; the kernels compiled for this
# GPU with their registers, spills and SASS counts (HMMA, LDL/STL, by
# cuobjdump); the CUDA tests (every kernel against the CPU backend, the
# fixtures against the transformers references, the SASS proof for sm_90
# and sm_121); then `sparkrt bench` on CUDA for the bench models (written
# once with `sparkrt make-checkpoint` into $SPARKRT_BENCH_DIR, default
# target/gpu-check-models, and reused on a rerun), and their performance
# models side by side; compute-sanitizer memcheck and racecheck on the
# attention and MoE tests; the host's memory readings around a CUDA server's
# load. Prints every figure, keeps all of it in one report file
# ($SPARKRT_GPU_REPORT, default target/gpu-check-report.txt) and exits
# non-zero if any step failed (a missing tool included).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
mkdir -p target
report="${SPARKRT_GPU_REPORT:-target/gpu-check-report.txt}"
exec > >(tee "$report") 2>&1

start=$SECONDS
failed=()
models="${SPARKRT_BENCH_DIR:-target/gpu-check-models}"
sparkrt=./target/release/sparkrt
logs=target/gpu-check-logs
# The CUDA topics of the one integration-test binary (tests/main.rs).
cuda_tests=(cuda_kernels:: cuda_fixtures:: cuda_nvrtc:: cuda_sass:: cuda_fallback:: cuda_faults::)

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

# cuobjdump (and the nvdisasm it runs) for the SASS columns and cuda_sass::
# tests: the CUDA toolkit's, else pip's; one quick try to install it.
if ! command -v cuobjdump >/dev/null 2>&1 && [[ ! -x /usr/local/cuda/bin/cuobjdump && -z "$(bash scripts/cuobjdump-path.sh)" ]]; then
	python3 -m pip install --quiet --disable-pip-version-check --retries 0 --timeout 10 \
		nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm ||
		echo "cuobjdump not installed: the SASS columns and tests will say so"
fi

run "release build" cargo build --release --quiet
run "test binaries" cargo test --release --quiet --no-run --test integration
run "kernels for this GPU (NVRTC, registers, spills, HMMA, LDL/STL)" "$sparkrt" kernels

# The tests print their figures (logit differences, weights residency).
# SPARKRT_REQUIRE_GPU=1: a test that finds no usable GPU fails instead of
# skipping; the weights test asserts the path Auto takes on this device
# (SPARKRT_EXPECT_RESIDENCY, unless set: copy on a discrete GPU, registered
# on an integrated one such as a GB10). Fails when no test ran.
cuda_test_run() {
	local log=target/gpu-check-cuda-tests.txt status ran integrated
	integrated="$("$sparkrt" probe --json | python3 -c 'import json, sys
d = json.load(sys.stdin)["gpu"].get("devices") or [{}]
print("1" if d[0].get("integrated") else "0")')" || integrated=0
	if [[ "$integrated" == 1 ]]; then
		export SPARKRT_EXPECT_RESIDENCY="${SPARKRT_EXPECT_RESIDENCY:-registered}"
	else
		export SPARKRT_EXPECT_RESIDENCY="${SPARKRT_EXPECT_RESIDENCY:-copy}"
	fi
	echo "weights residency expected: $SPARKRT_EXPECT_RESIDENCY"
	SPARKRT_REQUIRE_GPU=1 cargo test --release --test integration -- "${cuda_tests[@]}" --nocapture --test-threads 1 \
		>"$log" 2>&1
	status=$?
	grep -E '^test |differ|residency|skipp|panicked|test result' "$log"
	ran="$(sed -n 's/^test result: [a-zA-Z]*\. \([0-9]*\) passed.*/\1/p' "$log" | awk '{n += $1} END {print n + 0}')"
	echo "CUDA tests passed: $ran"
	if ((ran == 0)); then
		echo "no CUDA test ran" >&2
		return 1
	fi
	return "$status"
}
run "CUDA tests" cuda_test_run

# compute-sanitizer over the attention and MoE kernels' tests (the kernels
# with shared memory, atomics and split partials): memcheck for out-of-bounds
# and misaligned accesses, racecheck for shared-memory hazards. The test
# binary is the integration target just built.
sanitizer_tests=(cuda_kernels::attention_over_full_and_sliding_tables_matches_the_cpu cuda_kernels::routed_experts_match_the_cpu)
sanitize() {
	local tool="$1" sanitizer binary
	sanitizer="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)"
	if [[ -z "$sanitizer" ]]; then
		echo "compute-sanitizer not found (CUDA toolkit): $tool not run" >&2
		return 1
	fi
	binary="$(cargo test --release --no-run --test integration --message-format=json 2>/dev/null |
		python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "integration" and m.get("executable"):
        print(m["executable"])')"
	if [[ -z "$binary" ]]; then
		echo "the integration test binary was not found" >&2
		return 1
	fi
	SPARKRT_REQUIRE_GPU=1 "$sanitizer" --tool "$tool" --error-exitcode 1 \
		"$binary" "${sanitizer_tests[@]}" --exact --test-threads 1
}
run "compute-sanitizer memcheck (attention, MoE)" sanitize memcheck
run "compute-sanitizer racecheck (attention, MoE)" sanitize racecheck

for model in qwen3-30b-a3b-8l gpt-oss-120b-4l; do
	if [[ ! -f "$models/$model/model.safetensors" && ! -f "$models/$model/model.safetensors.index.json" ]]; then
		rm -rf "${models:?}/$model"
		run "write $model" "$sparkrt" make-checkpoint --like "benches/models/$model" --out "$models/$model"
	fi
done

# A bench run, its output kept in $logs/NAME.txt for the summary below.
bench() {
	local name="$1"
	shift
	"$sparkrt" bench --backend cuda "$@" 2>&1 | tee "$logs/$name.txt"
	return "${PIPESTATUS[0]}"
}
mkdir -p "$logs"
rm -f "$logs"/*.txt
run "bench qwen3-30b-a3b-8l, batch 1" \
	bench qwen3-batch-1 --model "$models/qwen3-30b-a3b-8l" --prompt-len 512 --gen 64 --repeats 2
run "bench qwen3-30b-a3b-8l, batch 32" \
	bench qwen3-batch-32 --model "$models/qwen3-30b-a3b-8l" --prompt-len 128 --gen 64 --repeats 1 --batch 32
run "bench gpt-oss-120b-4l, batch 1" \
	bench gpt-oss-batch-1 --model "$models/gpt-oss-120b-4l" --prompt-len 512 --gen 64 --repeats 2

# What MemAvailable, Mlocked, Unevictable and the cgroup's memory.current do
# when a server attaches the weights (README: the memory model, "What the
# host's figures miss on a GB10").
run "memory readings, qwen3-30b-a3b-8l on CUDA" \
	bash scripts/memory-readings.sh "$models/qwen3-30b-a3b-8l" cuda

# The performance model of each run together (README: Performance model):
# launches per layer, bytes per decode step, FLOPs per prefill token, and
# the measured rates as fractions of the bandwidth and tensor-core peak.
perf_summary() {
	local log
	for log in "$logs"/*.txt; do
		[[ -f "$log" ]] || continue
		echo "-- $(basename "$log" .txt)"
		grep -E '^  (prefill|decode|read bandwidth|launches / layer) ' "$log"
		sed -n '/performance model/,$p' "$log" | tail -n +2
	done
}
run "performance model" perf_summary

step "done"
if ((${#failed[@]} > 0)); then
	printf 'FAILED: %s\n' "${failed[@]}"
	echo "report: $report"
	exit 1
fi
echo "all steps passed"
echo "report: $report"
