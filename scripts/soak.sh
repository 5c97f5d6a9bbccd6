#!/usr/bin/env bash
# Soak test for `sparkrt serve` (not in CI): MINUTES (default 2) of mixed,
# partly abusive load against a server on 127.0.0.1 with the tiny fixture
# model and a fake host tree, then SIGTERM.
#
# The load (python3, standard library only), from a few threads:
#   streamed and blocking completions, streams dropped after the first event,
#   oversize bodies (9 MiB: past the body limit, ~1 MiB for the tiny model),
#   clients that send half a request line and nothing more (closed by the
#   header timeout), /health timed
#   throughout, and halfway a guard trip: the fake meminfo turns to garbage
#   for a few seconds (the guard must fail closed: 503 memory_guard).
#
# Prints requests served, errors by kind, the slowest /health, peak RSS
# (VmHWM) against the plan's total, and RSS and open fds at the end against
# the start (after a warm-up). Exits 1 if a check fails: a request kind that
# must succeed failed, the peak RSS went past the plan + 5%, the guard never
# tripped, slow-header clients were not closed, fds grew, or SIGTERM took
# longer than the drain bound.
#
# Usage: scripts/soak.sh [MINUTES]
#   SPARKRT=path/to/sparkrt   the binary (default: target/release/sparkrt,
#                             built with cargo if missing)
set -euo pipefail

minutes=${1:-2}
[[ $minutes =~ ^[0-9]+([.][0-9]+)?$ ]] || {
	echo "usage: scripts/soak.sh [MINUTES]" >&2
	exit 2
}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
binary=${SPARKRT:-$repo/target/release/sparkrt}
if [[ ! -x $binary ]]; then
	(cd "$repo" && cargo build --release --bin sparkrt)
fi

work=$(mktemp -d)
server_pid=""
# shellcheck disable=SC2317  # called by the trap
cleanup() {
	if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
		kill -KILL "$server_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

# The fake host: box24's meminfo, no kubelet.
mkdir -p "$work/host/proc"
cp "$repo/tests/fixtures/hosts/box24/proc/meminfo" "$work/host/proc/meminfo"

cd "$repo"
"$binary" serve --profile qwen3-moe-tiny --port 0 --threads 2 \
	--host-root "$work/host" --guard-interval-ms 100 2>"$work/serve.log" &
server_pid=$!
url=""
for _ in $(seq 600); do
	url=$(sed -n 's/^sparkrt: listening on //p' "$work/serve.log" | head -n1)
	[[ -n $url ]] && break
	kill -0 "$server_pid" 2>/dev/null || {
		cat "$work/serve.log" >&2
		exit 1
	}
	sleep 0.1
done
[[ -n $url ]] || {
	echo "the server never printed its address" >&2
	exit 1
}

status=0
python3 - "$url" "$server_pid" "$minutes" "$work/host" <<'PY' || status=$?
import http.client, json, os, random, socket, sys, threading, time, urllib.parse

url, pid, minutes, host_root = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
parsed = urllib.parse.urlparse(url)
HOST, PORT = parsed.hostname, parsed.port
DURATION = minutes * 60
MAX_REQUESTS = 200_000          # a bound whatever the speed
SLOW_CLIENTS = 16               # half-sent connections held at once
OVERSIZE = 9 << 20              # past max_body_bytes (server/limits.rs; ~1 MiB here)
RSS_TOLERANCE = 1.05
meminfo = os.path.join(host_root, "proc/meminfo")

lock = threading.Lock()
served = {}
errors = {}
health_worst = [0.0]
guard_refusals = [0]
slow_closed = [0]
total = [0]


def count(table, kind):
    with lock:
        table[kind] = table.get(kind, 0) + 1
        total[0] += 1


def status_kb(field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0


def fds():
    return len(os.listdir(f"/proc/{pid}/fd"))


def request(method, path, body=None, timeout=60):
    conn = http.client.HTTPConnection(HOST, PORT, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def classify(kind, status, body):
    if status == 200:
        count(served, kind)
        return
    code = ""
    try:
        code = json.loads(body)["error"].get("code") or ""
    except Exception:
        pass
    if code == "memory_guard":
        with lock:
            guard_refusals[0] += 1
    count(errors, f"{kind}: {status} {code}".strip())


def completion(stream, drop_early=False):
    body = json.dumps({"prompt": "Hello there", "max_tokens": random.randint(1, 16),
                       "stream": stream, "ignore_eos": True})
    kind = "stream dropped" if drop_early else ("stream" if stream else "blocking")
    conn = http.client.HTTPConnection(HOST, PORT, timeout=60)
    try:
        conn.request("POST", "/v1/completions", body=body,
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200 or not stream:
            classify(kind, response.status, response.read())
            return
        if drop_early:
            response.readline()
            count(served, kind)
            return  # closed mid-stream
        text = response.read().decode()
        if "data: [DONE]" in text:
            count(served, kind)
        else:
            count(errors, f"{kind}: no [DONE]")
    except Exception as e:
        count(errors, f"{kind}: {type(e).__name__}")
    finally:
        conn.close()


def oversize():
    try:
        status, body = request("POST", "/v1/completions", body=b"x" * OVERSIZE)
        if status in (400, 413):
            count(served, f"oversize refused {status}")
        else:
            count(errors, f"oversize: {status}")
    except (ConnectionResetError, BrokenPipeError):
        count(served, "oversize refused (reset)")
    except Exception as e:
        count(errors, f"oversize: {type(e).__name__}")


def worker(deadline, seed):
    rng = random.Random(seed)
    while time.monotonic() < deadline and total[0] < MAX_REQUESTS:
        r = rng.random()
        if r < 0.35:
            completion(stream=True)
        elif r < 0.65:
            completion(stream=False)
        elif r < 0.85:
            completion(stream=True, drop_early=True)
        elif r < 0.87:
            oversize()
        else:
            try:
                status, body = request("GET", "/v1/models")
                classify("models", status, body)
            except Exception as e:
                count(errors, f"models: {type(e).__name__}")


def slow_headers(deadline):
    """Keeps SLOW_CLIENTS connections that sent half a request line."""
    held = []
    while time.monotonic() < deadline:
        while len(held) < SLOW_CLIENTS:
            s = socket.create_connection((HOST, PORT), timeout=5)
            s.sendall(b"GET /health HT")
            s.setblocking(False)
            held.append(s)
        for s in list(held):
            try:
                if s.recv(4096) == b"":
                    raise ConnectionResetError
            except BlockingIOError:
                continue
            except OSError:
                pass
            s.close()
            held.remove(s)
            with lock:
                slow_closed[0] += 1
        time.sleep(0.5)
    for s in held:
        s.close()


def health(deadline):
    while time.monotonic() < deadline:
        start = time.monotonic()
        try:
            status, _ = request("GET", "/health", timeout=10)
            took = time.monotonic() - start
            with lock:
                health_worst[0] = max(health_worst[0], took)
            if status != 200:
                count(errors, f"health: {status}")
        except Exception as e:
            count(errors, f"health: {type(e).__name__}")
        time.sleep(0.1)


def guard_trip(at):
    time.sleep(at)
    with open(meminfo) as f:
        good = f.read()
    staging = meminfo + ".new"
    with open(staging, "w") as f:
        f.write("MemTotal: plenty\n")
    os.rename(staging, meminfo)
    time.sleep(3)
    with open(staging, "w") as f:
        f.write(good)
    os.rename(staging, meminfo)


# Warm up, then take the starting figures.
for _ in range(4):
    completion(stream=True)
status, body = request("GET", "/v1/memory")
plan_total = json.loads(body)["plan"]["total"]
rss_start, fds_start = status_kb("VmRSS:"), fds()
served.clear(); errors.clear(); total[0] = 0

deadline = time.monotonic() + DURATION
threads = [threading.Thread(target=worker, args=(deadline, i)) for i in range(4)]
threads += [threading.Thread(target=slow_headers, args=(deadline,)),
            threading.Thread(target=health, args=(deadline,)),
            threading.Thread(target=guard_trip, args=(DURATION / 2,))]
for t in threads:
    t.start()
for t in threads:
    t.join()
time.sleep(1)  # let the last connections close
rss_end, fds_end, peak = status_kb("VmRSS:"), fds(), status_kb("VmHWM:")

mib = lambda b: f"{b / (1 << 20):.1f} MiB"
print(f"soak: {minutes:g} min against {url}")
print(f"requests served: {sum(served.values())}")
for kind, n in sorted(served.items()):
    print(f"  {kind}: {n}")
print(f"errors: {sum(errors.values())}")
for kind, n in sorted(errors.items()):
    print(f"  {kind}: {n}")
print(f"guard refusals (503 memory_guard) during the trip: {guard_refusals[0]}")
print(f"slow-header clients closed by the server: {slow_closed[0]}")
print(f"slowest /health: {health_worst[0] * 1000:.1f} ms")
print(f"peak RSS {mib(peak)} against the plan's {mib(plan_total)} "
      f"({peak / plan_total:.0%})")
print(f"RSS {mib(rss_start)} -> {mib(rss_end)}; open fds {fds_start} -> {fds_end}")

failures = []
# Only the guard's refusals during the trip are expected errors.
unexpected = [k for k in errors if "memory_guard" not in k]
if unexpected:
    failures.append(f"unexpected errors: {unexpected}")
if peak > plan_total * RSS_TOLERANCE:
    failures.append("peak RSS past the plan + 5%")
if guard_refusals[0] == 0:
    failures.append("the guard never refused while meminfo was garbage")
if slow_closed[0] == 0 and DURATION > 15:
    failures.append("no slow-header client was closed")
if fds_end > fds_start + 4:
    failures.append(f"open fds grew from {fds_start} to {fds_end}")
for f in failures:
    print(f"FAIL: {f}")
sys.exit(1 if failures else 0)
PY

# SIGTERM with slow clients gone: the server must exit within the drain bound.
start=$(date +%s)
kill -TERM "$server_pid"
for _ in $(seq 350); do
	kill -0 "$server_pid" 2>/dev/null || break
	sleep 0.1
done
if kill -0 "$server_pid" 2>/dev/null; then
	echo "FAIL: still running 35 s after SIGTERM"
	status=1
else
	wait "$server_pid" || true
	echo "SIGTERM: exited after $(($(date +%s) - start)) s"
fi
exit "$status"
