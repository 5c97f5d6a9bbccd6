#!/usr/bin/env bash
# Soak test for `sparkrt serve` (not in CI): MINUTES (default 2) of mixed,
# partly abusive load against a server on 127.0.0.1 with the tiny fixture
# model and a fake host tree, then SIGTERM.
#
# The load (python3, standard library only), from a few threads:
#   streamed and blocking completions, streams dropped after the first event,
#   oversize bodies (9 MiB: past the body limit, ~1 MiB for the tiny model),
#   clients that send half a request line and nothing more (closed by the
#   header timeout), clients that send whole headers and part of a body and
#   then nothing (closed by the body deadline), a 60-byte body trickled at a
#   byte a second (cut by the minimum body rate), chat requests whose
#   template (a hostile --chat-template, driven by chat_template_kwargs)
#   loops 10^10 times or doubles a string into its output (400 naming the
#   limit), /health and /ready timed throughout, and halfway a guard trip:
#   the fake meminfo turns to garbage for a few seconds (the guard must fail
#   closed: 503 memory_guard).
#
# Prints requests served, errors by kind, /health and /ready p50 / p99 / max
# (thresholds: p99 <= 50 ms, max <= 1 s), peak RSS
# (VmHWM) against the plan's total, and RSS and open fds at the end against
# the start (after a warm-up). Exits 1 if a check fails: a request kind that
# must succeed failed, the peak RSS went past the plan + 5%, the guard never
# tripped, slow-header or stalled-body clients were not closed, a trickled
# body was taken, a hostile template was not refused naming its limit, the
# probes were slow, fds grew, or SIGTERM took
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

# ChatML, unless the request's chat_template_kwargs.mode asks it to loop, to
# double a string into its output, or to double one without writing it
# (tests/server_chat_template.rs).
cat >"$work/hostile.jinja" <<'JINJA'
{%- if mode == "loops" -%}
{%- for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor -%}
{%- elif mode == "double" -%}
{%- set ns = namespace(s=messages[0].content) -%}
{%- for i in range(64) %}{{ ns.s }}{% set ns.s = ns.s ~ ns.s %}{% endfor -%}
{%- elif mode == "build" -%}
{%- set ns = namespace(s=messages[0].content) -%}
{%- for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor -%}
{%- endif -%}
{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}
JINJA

cd "$repo"
"$binary" serve --profile qwen3-moe-tiny --port 0 --threads 2 \
	--host-root "$work/host" --guard-interval-ms 100 \
	--chat-template "$work/hostile.jinja" 2>"$work/serve.log" &
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
STALLED_BODIES = 64             # connections holding headers and part of a body
TRICKLE_BYTES = 60              # a body sent at a byte a second
PROBE_P99_S, PROBE_MAX_S = 0.050, 1.0
OVERSIZE = 9 << 20              # past max_body_bytes (server/limits.rs; ~1 MiB here)
RSS_TOLERANCE = 1.05
meminfo = os.path.join(host_root, "proc/meminfo")

lock = threading.Lock()
served = {}
errors = {}
probe_times = {"/health": [], "/ready": []}
stalled_closed = [0]
trickles = {"cut": 0, "taken": 0}
templates = {}
# Set while the fake meminfo is garbage (and a second after): /ready and
# every generation route answer 503 then, as they must.
tripping = [False]
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


def stalled_bodies(deadline):
    """Keeps STALLED_BODIES connections that sent whole headers and 10 of
    4096 body bytes, then nothing: the body deadline must close them."""
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 4096\r\n\r\n{\"prompt\":")
    held = []
    while time.monotonic() < deadline:
        while len(held) < STALLED_BODIES:
            s = socket.create_connection((HOST, PORT), timeout=5)
            s.sendall(head)
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
            # An answer (408) or a close: either way the server let go.
            s.close()
            held.remove(s)
            with lock:
                stalled_closed[0] += 1
        time.sleep(0.5)
    for s in held:
        s.close()


def trickle(deadline):
    """Every 15 s, a 60-byte body at one byte a second: the minimum body
    rate must cut it before it is whole."""
    while time.monotonic() + TRICKLE_BYTES + 5 < deadline:
        s = socket.create_connection((HOST, PORT), timeout=5)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\n"
                  + f"Content-Length: {TRICKLE_BYTES}\r\n\r\n".encode())
        cut = False
        for _ in range(TRICKLE_BYTES):
            try:
                s.sendall(b" ")
            except OSError:
                cut = True
                break
            time.sleep(1)
            s.setblocking(False)
            try:
                s.recv(4096)
                cut = True  # an answer (408) or a close before the body was whole
                break
            except BlockingIOError:
                pass
            except OSError:
                cut = True
                break
            finally:
                s.setblocking(True)
        s.close()
        with lock:
            trickles["cut" if cut else "taken"] += 1
        time.sleep(15)


def hostile_templates(deadline):
    """Chat requests whose template loops or doubles: each a 400 naming the
    limit, in bounded time."""
    expected = {"loops": "max_template_fuel", "double": "max_template_output_bytes",
                "build": "max_template_memory_bytes"}
    while time.monotonic() < deadline:
        for mode, code in expected.items():
            body = json.dumps({"messages": [{"role": "user", "content": "hello"}],
                               "max_tokens": 1, "chat_template_kwargs": {"mode": mode}})
            try:
                status, reply = request("POST", "/v1/chat/completions", body=body, timeout=30)
                got = json.loads(reply).get("error", {}).get("code") if status == 400 else status
            except Exception as e:
                got = type(e).__name__
            if got == 503 and tripping[0]:
                continue  # refused by the guard before rendering
            key = f"{mode}: {got}"
            with lock:
                templates[key] = templates.get(key, 0) + 1
        time.sleep(2)


def probes(deadline):
    while time.monotonic() < deadline:
        for path in probe_times:
            start = time.monotonic()
            try:
                status, _ = request("GET", path, timeout=10)
                took = time.monotonic() - start
                with lock:
                    probe_times[path].append(took)
                if status == 503 and path == "/ready" and tripping[0]:
                    with lock:
                        guard_refusals[0] += 1
                elif status != 200:
                    count(errors, f"{path}: {status}")
            except Exception as e:
                count(errors, f"{path}: {type(e).__name__}")
        time.sleep(0.1)


def quantiles(samples):
    s = sorted(samples)
    if not s:
        return 0.0, 0.0, 0.0
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))]
    return pick(0.5), pick(0.99), s[-1]


def guard_trip(at):
    time.sleep(at)
    with open(meminfo) as f:
        good = f.read()
    staging = meminfo + ".new"
    with open(staging, "w") as f:
        f.write("MemTotal: plenty\n")
    tripping[0] = True
    os.rename(staging, meminfo)
    time.sleep(3)
    with open(staging, "w") as f:
        f.write(good)
    os.rename(staging, meminfo)
    time.sleep(1)  # the guard reads every 100 ms; its resume has a margin
    tripping[0] = False


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
            threading.Thread(target=stalled_bodies, args=(deadline,)),
            threading.Thread(target=trickle, args=(deadline,)),
            threading.Thread(target=hostile_templates, args=(deadline,)),
            threading.Thread(target=probes, args=(deadline,)),
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
print(f"stalled-body clients closed by the server: {stalled_closed[0]}")
print(f"trickled bodies: {trickles['cut']} cut, {trickles['taken']} taken whole")
print("hostile templates: " + ", ".join(f"{k} x{n}" for k, n in sorted(templates.items())))
slow_probes = []
for path, samples in probe_times.items():
    p50, p99, worst = quantiles(samples)
    print(f"{path}: {len(samples)} probes, p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
          f"max {worst * 1000:.1f} ms")
    if p99 > PROBE_P99_S or worst > PROBE_MAX_S:
        slow_probes.append(path)
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
# The body deadline is 30 s (server/limits.rs).
if stalled_closed[0] == 0 and DURATION > 40:
    failures.append("no stalled-body client was closed")
if trickles["taken"]:
    failures.append(f"{trickles['taken']} trickled bodies were taken whole")
bad_templates = [k for k in templates if not k.endswith(
    ("max_template_fuel", "max_template_output_bytes", "max_template_memory_bytes"))]
if bad_templates or not templates:
    failures.append(f"hostile templates not refused by their limit: {bad_templates or 'none sent'}")
if slow_probes:
    failures.append(f"probes past p99 {PROBE_P99_S * 1000:.0f} ms or max {PROBE_MAX_S * 1000:.0f} ms: {slow_probes}")
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
