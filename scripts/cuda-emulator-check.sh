#!/usr/bin/env bash
# Runs the CUDA backend's tests on a machine without a GPU: builds the CPU
# emulator of the CUDA driver (kernels/emu, a test tool: the same kernel
# sources compiled as C++, CUDA threads as fibers) as libcuda.so and puts it
# on LD_LIBRARY_PATH, so the backend's host code, parameter layouts and
# kernel logic run for real. Needs g++ (C++20) and NVRTC (the kernels are
# still compiled to CUBIN, as on a GPU). What it cannot show: speed, the GPU
# memory model, hardware limits.
#
# Three device kinds, each asserting the weight path it takes
# (SPARKRT_EXPECT_RESIDENCY, read by cuda_kernels' weights test):
#   discrete    EMU_INTEGRATED=0: weights copied to device memory (every CUDA test);
#   registered  EMU_INTEGRATED=1: the mapping registered (cuMemHostRegister)
#               and read in place, as on a GB10;
#   mapped      EMU_INTEGRATED=1 EMU_PAGEABLE=1 EMU_NO_REGISTER=1: registration
#               refused, pageable memory read directly.
# The integrated runs take only the tests whose weights go through the
# attach path the device kind changes: the weights test and the fixtures.
# SPARKRT_REQUIRE_GPU=1 turns every "no usable GPU" skip into a failure;
# each run checks the libcuda loaded is the emulator (the device name and
# kind the probe reports) and fails if no test ran. Extra arguments go to
# `cargo test` (e.g. --release).
set -euo pipefail
cd "$(dirname "$0")/.."

emulator="target/cuda-emulator"
kernels/emu/build.sh "$emulator"
export LD_LIBRARY_PATH="$PWD/$emulator${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export SPARKRT_REQUIRE_GPU=1
# What kernels/emu/driver.cpp's cuDeviceGetName answers.
readonly EMULATOR_NAME="sparkrt CPU emulator"
logs="target/cuda-emulator-logs"
mkdir -p "$logs"

# The probe's GPU as "name|integrated|pageable", under the current EMU_* env.
probed_device() {
	cargo run --quiet --profile test --bin sparkrt -- probe --json |
		python3 -c 'import json, sys
devices = json.load(sys.stdin)["gpu"].get("devices") or [{}]
g = devices[0]
flag = lambda key: "true" if g.get(key) else "false"
print("|".join([str(g.get("name")), flag("integrated"), flag("pageable_memory_access")]))'
}

# Tests passed in cargo's `test result:` lines of log $1.
tests_passed() {
	sed -n 's/^test result: [a-zA-Z]*\. \([0-9]*\) passed.*/\1/p' "$1" | awk '{n += $1} END {print n + 0}'
}

# run_mode NAME RESIDENCY INTEGRATED PAGEABLE NO_REGISTER FILTER...
run_mode() {
	local name="$1" residency="$2" integrated="$3" pageable="$4" no_register="$5"
	shift 5
	local filters=("$@")
	export EMU_INTEGRATED="$integrated" EMU_PAGEABLE="$pageable" EMU_NO_REGISTER="$no_register"
	export SPARKRT_EXPECT_RESIDENCY="$residency"
	local started=$SECONDS want device
	want="$EMULATOR_NAME|$([[ $integrated == 1 ]] && echo true || echo false)|$([[ $pageable == 1 ]] && echo true || echo false)"
	device="$(probed_device)"
	if [[ "$device" != "$want" ]]; then
		echo "cuda-emulator-check: $name: the probe found '$device', expected '$want' (is $emulator/libcuda.so the libcuda loaded?)" >&2
		exit 1
	fi
	echo "== $name device (EMU_INTEGRATED=$integrated EMU_PAGEABLE=$pageable EMU_NO_REGISTER=$no_register), weights expected: $residency"
	local log="$logs/$name.txt" status=0
	cargo test --test integration "${cargo_args[@]}" -- "${filters[@]}" 2>&1 | tee "$log" || status=$?
	local ran
	ran="$(tests_passed "$log")"
	echo "cuda-emulator-check: $name: $ran CUDA tests passed in $((SECONDS - started)) s"
	if ((status != 0)); then
		echo "cuda-emulator-check: $name: cargo test failed" >&2
		exit "$status"
	fi
	if ((ran == 0)); then
		echo "cuda-emulator-check: $name: no CUDA test ran" >&2
		exit 1
	fi
}

cargo_args=("$@")
weight_path_tests=(cuda_kernels::weights_attached_in_place_read_the_same_as_a_copy cuda_fixtures::)
run_mode discrete copy 0 0 0 cuda_kernels:: cuda_fixtures:: cuda_fallback:: cuda_faults::
run_mode registered registered 1 0 0 "${weight_path_tests[@]}"
run_mode mapped mapped 1 1 1 "${weight_path_tests[@]}"
echo "cuda-emulator-check: all three device kinds passed"
