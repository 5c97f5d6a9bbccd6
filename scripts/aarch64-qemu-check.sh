#!/usr/bin/env bash
# The CPU kernels' aarch64 (NEON) path, as on a DGX Spark's Grace CPU, on
# an x86-64 machine: cross-builds the kernel and engine tests and runs them
# under qemu-aarch64 (Debian: gcc-aarch64-linux-gnu, libc6-dev-arm64-cross,
# qemu-user; `rustup target add aarch64-unknown-linux-gnu`). Correctness
# only: qemu says nothing about speed.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
cargo test --release --target aarch64-unknown-linux-gnu \
	--test integration "$@" -- \
	kernels_batch_invariance:: kernels_matmul:: kernels_ops:: kernels_quantize:: engine_fixtures::
