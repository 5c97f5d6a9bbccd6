#!/usr/bin/env bash
# A text capture of `sparkrt top` in a real terminal (tmux, COLSxROWS,
# default 120x40) while a server of the hybrid fixture (qwen35-moe-tiny,
# Gated DeltaNet + MoE) serves repeated prompts with n-gram speculative
# decoding and the prefix cache: the README's monitor capture. Prints the
# screen after SECONDS (default 8) of load.
#
#   scripts/top-capture.sh [SECONDS] [COLSxROWS]
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-8}
size=${2:-120x40}
cargo build --release --quiet
bin=target/release/sparkrt
host=tests/fixtures/hosts/box24
work=$(mktemp -d)
socket="sparkrt-capture-$$"
server_pid=""
# shellcheck disable=SC2317  # called by the trap
cleanup() {
	tmux -L "$socket" kill-server 2>/dev/null || true
	if [[ -n $server_pid ]]; then kill "$server_pid" 2>/dev/null || true; fi
	rm -rf "$work"
}
trap cleanup EXIT

"$bin" serve --model tests/fixtures/qwen35-moe-tiny --port 0 --host-root "$host" \
	--speculative-config '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}' \
	2>"$work/serve.log" &
server_pid=$!
url=""
for _ in $(seq 300); do
	url=$(sed -n 's/^sparkrt: listening on //p' "$work/serve.log" | head -n1)
	[[ -n $url ]] && break
	sleep 0.1
done
[[ -n $url ]] || {
	cat "$work/serve.log" >&2
	exit 1
}

# Load: a few clients resending prompts that repeat a phrase.
python3 - "$url" "$seconds" <<'PY' &
import json, sys, threading, time, urllib.request
url, seconds = sys.argv[1], float(sys.argv[2]) + 4
def client(k):
    phrase = [17 + (i * 37 + k * 11) % 480 for i in range(9)]
    body = json.dumps({"prompt": (phrase * 8)[:60], "max_tokens": 64,
                       "temperature": 0}).encode()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        req = urllib.request.Request(url + "/v1/completions", body,
                                     {"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=30).read()
threads = [threading.Thread(target=client, args=(k,)) for k in range(3)]
for t in threads: t.start()
for t in threads: t.join()
PY
load_pid=$!

tmux -L "$socket" new-session -d -s capture -x "${size%x*}" -y "${size#*x}" \
	"$bin top --url $url --host-root $host --interval 500ms; sleep 60"
sleep "$seconds"
tmux -L "$socket" capture-pane -p -t capture
wait "$load_pid" || true
