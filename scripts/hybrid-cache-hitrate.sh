#!/usr/bin/env bash
# Prefix-cache hit rate on a hybrid (Gated DeltaNet) model against the
# snapshot interval: scripts/load.py's shared-prefix workload (one system
# prompt, a question each) against `sparkrt serve` on the qwen35-moe-tiny
# fixture, once without prefix caching and once per interval. Prints the
# hit rate, TTFT and the plan's recurrent-state lines for each.
#
#   scripts/hybrid-cache-hitrate.sh [SYSTEM_TOKENS] [INTERVAL ...]
#
# Needs a release build (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=target/release/sparkrt
SYSTEM=${1:-1500}
if (($# > 1)); then
	INTERVALS=("${@:2}")
else
	INTERVALS=(0 256 512 1024)
fi
MODEL=(--model tests/fixtures/qwen35-moe-tiny --max-model-len 2048 --max-num-seqs 4
	--max-num-batched-tokens 512)
port=18400

run() {
	port=$((port + 1))
	"$BIN" serve "${MODEL[@]}" --port "$port" "$@" >"/tmp/sparkrt-hitrate-$port.log" 2>&1 &
	local pid=$!
	for _ in $(seq 120); do
		curl -sf "http://127.0.0.1:$port/ready" >/dev/null && break
		sleep 0.5
	done
	echo "== $*"
	python3 scripts/load.py --url "http://127.0.0.1:$port" --workload shared-prefix \
		--system-tokens "$SYSTEM" --prompt-tokens 64 --output-tokens 8 --clients 4 \
		--requests 32 --pid "$pid" | grep -E "hit rate|TTFT"
	"$BIN" plan "${MODEL[@]}" "$@" | grep -iE "snapshot|recurrent|live slots" || true
	kill "$pid"
	wait "$pid" 2>/dev/null || true
}

run --no-prefix-caching
for interval in "${INTERVALS[@]}"; do
	run --state-snapshot-interval "$interval"
done
