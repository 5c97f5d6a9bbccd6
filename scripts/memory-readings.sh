#!/usr/bin/env bash
# What the host's own memory figures say before and after a server loads its
# weights: MemAvailable, Cached, Mlocked and Unevictable from /proc/meminfo,
# and the server's cgroup `memory.current`, with the ledger's weights
# residency and totals from /v1/memory. On a GB10 this measures what the
# memory guard assumes (README, "What the host's figures miss on a GB10"):
# whether registered weights stay in MemAvailable, and how much of the
# driver's allocations `memory.current` sees.
#
# usage: scripts/memory-readings.sh [MODEL_DIR] [BACKEND] [PORT]
#   MODEL_DIR  default: tests/fixtures/qwen3-moe-tiny
#   BACKEND    cpu | cuda (default: cpu)
#   PORT       default: 18391
set -euo pipefail
cd "$(dirname "$0")/.."

model="${1:-tests/fixtures/qwen3-moe-tiny}"
backend="${2:-cpu}"
port="${3:-18391}"
sparkrt="${SPARKRT:-target/release/sparkrt}"
[[ -x "$sparkrt" ]] || cargo build --release --quiet --bin sparkrt

meminfo_kib() { awk -v k="$1:" '$1 == k { print $2 }' /proc/meminfo; }

# The cgroup v2 `memory.current` of process $1, or "n/a".
cgroup_current() {
	local path
	path="$(sed -n 's/^0:://p' "/proc/$1/cgroup" 2>/dev/null || true)"
	if [[ -n "$path" && -r "/sys/fs/cgroup$path/memory.current" ]]; then
		cat "/sys/fs/cgroup$path/memory.current"
	else
		echo "n/a"
	fi
}

reading() {
	local label="$1" pid="$2"
	printf '%-7s MemAvailable %s kB, Cached %s kB, Mlocked %s kB, Unevictable %s kB, memory.current %s B\n' \
		"$label" "$(meminfo_kib MemAvailable)" "$(meminfo_kib Cached)" "$(meminfo_kib Mlocked)" \
		"$(meminfo_kib Unevictable)" "$(cgroup_current "$pid")"
}

reading before $$
"$sparkrt" serve "$model" --backend "$backend" --port "$port" >"${TMPDIR:-/tmp}/memory-readings-serve.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
	if curl -fsS "http://127.0.0.1:$port/ready" >/dev/null 2>&1; then
		break
	fi
	if ! kill -0 "$server" 2>/dev/null; then
		echo "the server exited before it was ready:" >&2
		cat "${TMPDIR:-/tmp}/memory-readings-serve.log" >&2
		exit 1
	fi
	sleep 1
done
curl -fsS "http://127.0.0.1:$port/ready" >/dev/null || {
	echo "the server was not ready after 600 s" >&2
	exit 1
}
reading after "$server"
curl -fsS "http://127.0.0.1:$port/v1/memory" | python3 -c '
import json, sys
m = json.load(sys.stdin)
ledger = m.get("ledger", {})
print("ledger  weights residency:", ledger.get("weights_residency"))
for row in ledger.get("categories", []):
    name, planned, allocated = row["name"], row["planned"], row["allocated"]
    print(f"        {name:<16} planned {planned:>14} B  allocated {allocated:>14} B")
guard = m.get("guard", {})
print("guard   tripped:", guard.get("tripped"), " reason:", guard.get("reason"))
'
