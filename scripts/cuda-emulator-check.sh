#!/usr/bin/env bash
# Runs the CUDA backend's tests on a machine without a GPU: builds the CPU
# emulator of the CUDA driver (kernels/emu, a test tool: the same kernel
# sources compiled as C++, CUDA threads as fibers) as libcuda.so and puts it
# on LD_LIBRARY_PATH, so the backend's host code, parameter layouts and
# kernel logic run for real. Needs g++ (C++20) and NVRTC (the kernels are
# still compiled to CUBIN, as on a GPU). What it cannot show: speed, the GPU
# memory model, hardware limits.
set -euo pipefail
cd "$(dirname "$0")/.."

emulator="target/cuda-emulator"
kernels/emu/build.sh "$emulator"
LD_LIBRARY_PATH="$PWD/$emulator${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
	cargo test --test integration "$@" -- cuda_kernels:: cuda_fixtures:: cuda_fallback::
