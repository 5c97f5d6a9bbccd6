#!/usr/bin/env bash
# Cold start of `sparkrt serve`, measured against the disk, in one run:
#
#   scripts/cold-start.sh [--fadvise] [MODEL_DIR]
#
# 1. the disk's sequential read rate of the checkpoint's files (page cache
#    dropped, then `dd` to /dev/null);
# 2. serve from a cold page cache: time to /ready, the weights' resident
#    fraction at ready (/v1/memory, measured with mincore), the first
#    request's time (max_tokens 1: its time to first token);
# 3. serve again with the page cache warm: the same figures;
# 4. the goal ratio: time to ready ÷ (checkpoint bytes ÷ disk rate), goal
#    ≤ 1.15; and the first request cold ÷ warm (goal 1).
# 5. llama.cpp loading its GGUF of the same weights cold, mmap and
#    --no-mmap, when LLAMA_CLI (a llama-cli binary) and LLAMA_GGUF are set
#    (scripts/gguf-from-checkpoint.py writes the GGUF of a bench model).
#
# The page cache is dropped with `echo 3 > /proc/sys/vm/drop_caches` as
# root; not root, read-only /proc/sys, or --fadvise (a shared machine: the
# global drop slows everyone): each file is synced and evicted with
# posix_fadvise(DONTNEED) (`dd iflag=nocache count=0`), which works
# unprivileged for clean pages.
#
# MODEL_DIR defaults to target/bench-models/qwen3-30b-a3b-8l, written with
# `sparkrt make-checkpoint --like benches/models/qwen3-30b-a3b-8l` when
# missing. SPARKRT picks the binary (default target/release/sparkrt, else
# target/debug/sparkrt).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
fadvise_only=0
if [[ "${1:-}" == "--fadvise" ]]; then
	fadvise_only=1
	shift
fi
model=${1:-$repo/target/bench-models/qwen3-30b-a3b-8l}
sparkrt=${SPARKRT:-$repo/target/release/sparkrt}
[[ -x "$sparkrt" ]] || sparkrt=$repo/target/debug/sparkrt
[[ -x "$sparkrt" ]] || {
	echo "no sparkrt binary: cargo build --release" >&2
	exit 1
}
if [[ ! -d "$model" ]]; then
	echo "writing the bench checkpoint to $model"
	"$sparkrt" make-checkpoint --like "$repo/benches/models/qwen3-30b-a3b-8l" --out "$model" --shards 4
fi
mapfile -t files < <(find "$model" -maxdepth 1 -name '*.safetensors' | sort)
bytes=$(stat -c %s "${files[@]}" | awk '{s += $1} END {print s}')
echo "checkpoint: $model, ${#files[@]} files, $(awk -v b="$bytes" 'BEGIN {printf "%.2f", b / 1e9}') GB"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs, $(free -g | awk '/^Mem:/ {print $2}') GiB"

# The kernel drops clean pages only: write dirty ones first.
drop_cache() {
	sync
	if [[ $fadvise_only -eq 0 && $(id -u) -eq 0 ]] && echo 3 2>/dev/null >/proc/sys/vm/drop_caches; then
		drop_how="drop_caches"
		return
	fi
	drop_how="posix_fadvise(DONTNEED) per file"
	for f in "${files[@]}"; do
		dd if="$f" iflag=nocache count=0 status=none
	done
}

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.3f", b - a}'; }

# 1. The disk's sequential read rate of the same files.
drop_cache
echo "page cache dropped with: $drop_how"
if [[ $fadvise_only -eq 0 && "$drop_how" != "drop_caches" ]]; then
	echo "  (not root, or /proc/sys/vm/drop_caches is read-only: fell back to fadvise)"
fi
start=$(now)
for f in "${files[@]}"; do
	dd if="$f" of=/dev/null bs=16M status=none
done
dd_seconds=$(elapsed "$start")
rate=$(awk -v b="$bytes" -v s="$dd_seconds" 'BEGIN {printf "%.0f", b / s}')
echo "dd, cold: ${dd_seconds} s, $(awk -v r="$rate" 'BEGIN {printf "%.2f", r / 1e9}') GB/s"

log=$(mktemp)
server_pid=""
stop_server() {
	if [[ -n "$server_pid" ]]; then
		kill -TERM "$server_pid" 2>/dev/null || true
		wait "$server_pid" 2>/dev/null || true
		server_pid=""
	fi
}
trap 'stop_server; rm -f "$log"' EXIT

# Starts serve, waits for /ready; sets ready_seconds, resident, first_seconds.
run_serve() {
	local start url
	start=$(now)
	"$sparkrt" serve --model "$model" --port 0 --max-model-len 1024 --max-num-seqs 1 2>"$log" &
	server_pid=$!
	url=""
	until [[ -n "$url" ]]; do
		kill -0 "$server_pid" 2>/dev/null || {
			cat "$log" >&2
			exit 1
		}
		url=$(sed -n 's/.*answer on \(http:[^ ]*\).*/\1/p' "$log" | head -1)
		sleep 0.02
	done
	until [[ $(curl -s -o /dev/null -w '%{http_code}' "$url/ready") == 200 ]]; do
		kill -0 "$server_pid" 2>/dev/null || {
			cat "$log" >&2
			exit 1
		}
		sleep 0.05
	done
	ready_seconds=$(elapsed "$start")
	resident=$(curl -s "$url/v1/memory" | jq '100 * .loading.resident_bytes / .loading.mapped_bytes')
	first_seconds=$(curl -s -o /dev/null -w '%{time_total}' "$url/v1/completions" \
		-H 'content-type: application/json' \
		-d '{"prompt": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": 1}')
	stop_server
}

drop_cache
run_serve
cold_ready=$ready_seconds cold_resident=$resident cold_first=$first_seconds
run_serve
warm_ready=$ready_seconds warm_resident=$resident warm_first=$first_seconds

printf '%-22s %10s %10s\n' "serve" "cold" "warm"
printf '%-22s %10s %10s\n' "time to /ready (s)" "$cold_ready" "$warm_ready"
printf '%-22s %10.1f %10.1f\n' "resident at ready (%)" "$cold_resident" "$warm_resident"
printf '%-22s %10s %10s\n' "first request (s)" "$cold_first" "$warm_first"
awk -v t="$cold_ready" -v b="$bytes" -v r="$rate" -v c="$cold_first" -v w="$warm_first" 'BEGIN {
	printf "goal ratio: time to ready / (bytes / disk rate) = %.2f (goal <= 1.15)\n", t / (b / r)
	printf "first request cold / warm = %.2f (goal 1)\n", c / w
}'

# 5. llama.cpp, cold, mmap against --no-mmap.
if [[ -n "${LLAMA_CLI:-}" && -n "${LLAMA_GGUF:-}" && -x "$LLAMA_CLI" ]]; then
	# Newer builds replaced --no-mmap with --load-mode (none: plain reads).
	no_mmap=(--no-mmap)
	# (The help is read whole first: `grep -q` would end the pipe early.)
	llama_help=$("$LLAMA_CLI" --help 2>&1 || true)
	if [[ $llama_help == *--load-mode* ]]; then
		no_mmap=(--load-mode none)
	fi
	for mode in mmap no-mmap; do
		flag=()
		[[ $mode == no-mmap ]] && flag=("${no_mmap[@]}")
		sync
		dd if="$LLAMA_GGUF" iflag=nocache count=0 status=none
		start=$(now)
		if "$LLAMA_CLI" -m "$LLAMA_GGUF" "${flag[@]}" -p hi -n 1 -no-cnv >"$log" 2>&1; then
			echo "llama.cpp cold, $mode: $(elapsed "$start") s (load and one token)"
		else
			echo "llama.cpp cold, $mode: failed (its log follows)"
			tail -5 "$log"
		fi
	done
else
	echo "llama.cpp: skipped (set LLAMA_CLI to a llama-cli binary and LLAMA_GGUF to the GGUF of these weights)"
fi
