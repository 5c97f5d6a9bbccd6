#!/usr/bin/env bash
# Builds the CPU emulator of the CUDA driver (a test tool) into $1/libcuda.so.
# Not libcuda.so.1: NVRTC opens that name for the real driver's private
# export tables, which the emulator does not have.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: build.sh OUT_DIR}"
mkdir -p "$out/include"
# constants.cuh, which kernels/common.cuh includes: the numbers the kernels
# share with the host, written by the host (src/backend/cuda/constants.rs)
# as it gives them to NVRTC. The test profile's binary is the one
# `cargo test` builds anyway.
cargo run --quiet --profile test --manifest-path "$here/../../Cargo.toml" --bin sparkrt -- \
	kernels --constants >"$out/include/constants.cuh"
g++ -std=c++20 -O2 -g -fPIC -shared -pthread -fvisibility=hidden -fno-strict-aliasing \
	-Wall -Wno-unknown-pragmas -Wno-unused-function -Wno-unused-variable \
	-fsanitize=alignment,bounds -fno-sanitize-recover=all \
	-I"$here/.." -I"$out/include" "$here"/*.cpp -o "$out/libcuda.so"
