#!/usr/bin/env python3
"""Load benchmark for `sparkrt serve` (standard library only).

N concurrent clients stream completions with a fixed prompt length (random
token ids, so no tokenizer is needed) and a fixed output length
(`ignore_eos`), until the total number of requests is done. Prints
requests/s, output tokens/s, p50/p99 time to first token and inter-token
latency, and the server's peak RSS (VmHWM from /proc) against the plan's
total from /v1/memory, which it must stay within (+5%).

`--workload shared-prefix` sends every request one system prompt of
`--system-tokens` ids followed by its own question of `--prompt-tokens` ids
(an agent's or a chat UI's traffic), and also prints the prefix-cache hit
rate: cached prompt tokens over prompt tokens, from
`usage.prompt_tokens_details.cached_tokens` where the server reports it
("not reported" where it does not), and the /metrics counters
`sparkrt_prefix_cache_queries_total` / `sparkrt_prefix_cache_hits_total`
(their increase over the run) where they exist. Run it once against a
server with prefix caching and once with `serve --no-prefix-caching`, each
with `--json-out FILE`, then `--compare WITH WITHOUT` prints the two side by
side: hit rate, TTFT p50/p99 and their ratio (without / with), throughput,
and the peak RSS of both servers against the plan, which caching must not
change (the cache lives in the planned KV pool).

Usage:
  scripts/load.py --url http://127.0.0.1:8000 --clients 8 --requests 32 \\
      --prompt-tokens 128 --output-tokens 64 [--pid PID] [--api-key KEY]
  scripts/load.py --url http://127.0.0.1:8000 --workload shared-prefix \\
      --system-tokens 2048 --prompt-tokens 32 --output-tokens 16 --json-out with.json
  scripts/load.py --compare with.json without.json

Without --pid the server is found by the port it listens on (/proc/net/tcp),
which needs the same machine and permission to read its /proc entries.
Exits 1 if a request fails or the peak RSS exceeds the plan's total + 5%;
`--compare` exits 1 if either run did, or if the runs' workloads differ.
"""

import argparse
import http.client
import json
import os
import random
import sys
import threading
import time
import urllib.parse

RSS_TOLERANCE = 1.05


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="server root, http://HOST:PORT (required unless --compare)")
    p.add_argument("--clients", type=int, default=8, help="concurrent streaming clients")
    p.add_argument("--requests", type=int, default=32, help="requests in all")
    p.add_argument("--workload", choices=["random", "shared-prefix"], default="random",
                   help="random prompts, or one shared system prompt and a question each")
    p.add_argument("--system-tokens", type=int, default=1024,
                   help="shared-prefix: tokens of the system prompt every request starts with")
    p.add_argument("--prompt-tokens", type=int, default=128,
                   help="tokens of each prompt (shared-prefix: of each question, after the system prompt)")
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--warmup", type=int, default=1, help="requests sent one by one before measuring")
    p.add_argument("--pid", type=int, help="server process id (default: found by port)")
    p.add_argument("--api-key", help="sent as Authorization: Bearer KEY")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts' token ids")
    p.add_argument("--json", action="store_true", help="also print the figures as one JSON object")
    p.add_argument("--json-out", metavar="FILE", help="also write the figures as one JSON object to FILE")
    p.add_argument("--compare", nargs=2, metavar=("WITH", "WITHOUT"),
                   help="print two runs' figures (--json-out files, or saved --json output) side by "
                        "side: WITH prefix caching and WITHOUT; sends no request")
    args = p.parse_args()
    if args.compare is None and args.url is None:
        p.error("--url is required (unless --compare)")
    return args


class Client:
    """One keep-alive connection to the server."""

    def __init__(self, url, api_key):
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise SystemExit(f"--url {url!r}: expected http://HOST:PORT")
        self.host = parsed.hostname
        self.port = parsed.port or 80
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.conn = None

    def _connection(self):
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=3600)
        return self.conn

    def get(self, path):
        reused = self.conn is not None
        conn = self._connection()
        try:
            conn.request("GET", path, headers=self.headers)
            response = conn.getresponse()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            if not reused:
                raise
            # The server closes a keep-alive connection idle for 10 s (e.g.
            # this one, during a run): a GET is safe to send again on a new one.
            conn.close()
            self.conn = None
            conn = self._connection()
            conn.request("GET", path, headers=self.headers)
            response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"GET {path}: {response.status} {body[:200]!r}")
        return body

    def get_json(self, path):
        return json.loads(self.get(path))

    def stream(self, body):
        """Streams one completion; returns (start, [(time, tokens in the chunk)], usage)."""
        conn = self._connection()
        start = time.perf_counter()
        conn.request("POST", "/v1/completions", body=json.dumps(body), headers=self.headers)
        response = conn.getresponse()
        if response.status != 200:
            text = response.read()
            raise RuntimeError(f"POST /v1/completions: {response.status} {text[:300]!r}")
        arrivals = []
        usage = None
        done = False
        while True:
            line = response.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue  # blank separators and keep-alive comments
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"error in the stream: {chunk['error']}")
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                tokens = len(choice.get("token_ids") or [])
                if tokens:
                    arrivals.append((time.perf_counter(), tokens))
        if not done:
            raise RuntimeError("the stream ended without [DONE]")
        return start, arrivals, usage


def percentile(values, q):
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


PREFIX_COUNTERS = ("sparkrt_prefix_cache_queries_total", "sparkrt_prefix_cache_hits_total")


def prefix_counters(client):
    """The prefix-cache counters of /metrics (summed over their labels), or
    None where the server has none."""
    totals = {}
    try:
        text = client.get("/metrics").decode()
    except RuntimeError:
        return None
    for row in text.splitlines():
        if row.startswith("#") or not row.strip():
            continue
        name = row.split("{", 1)[0].split(" ", 1)[0]
        if name in PREFIX_COUNTERS:
            totals[name] = totals.get(name, 0.0) + float(row.rsplit(" ", 1)[1])
    return totals if len(totals) == len(PREFIX_COUNTERS) else None


def cached_tokens(usage):
    """`usage.prompt_tokens_details.cached_tokens`, or None when not reported."""
    details = (usage or {}).get("prompt_tokens_details") or {}
    value = details.get("cached_tokens")
    return value if isinstance(value, int) else None


def listening_pid(port):
    """The process listening on TCP `port` (IPv4 or IPv6), from /proc."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for row in f:
                    fields = row.split()
                    local, state, inode = fields[1], fields[3], fields[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        inodes.add(f"socket:[{inode}]")
        except OSError:
            continue
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return int(pid)
        except OSError:
            continue
    return None


def status_bytes(pid, field):
    """A `kB` field of /proc/PID/status (VmHWM, VmRSS) in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for row in f:
            if row.startswith(field + ":"):
                return int(row.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def main():
    args = parse_args()
    if args.compare:
        sys.exit(compare(*args.compare))
    client = Client(args.url, args.api_key)
    memory = client.get_json("/v1/memory")
    models = client.get_json("/v1/models")
    model = models["data"][0]["id"]
    vocab = memory["plan"]["model"]["vocab_size"]
    plan_total = memory["plan"]["total"]
    max_model_len = memory["plan"]["serving"]["max_model_len"]
    shared = args.workload == "shared-prefix"
    prompt_len = args.prompt_tokens + (args.system_tokens if shared else 0)
    if prompt_len + args.output_tokens > max_model_len:
        raise SystemExit(f"prompt + output tokens exceed max_model_len = {max_model_len}")
    pid = args.pid or listening_pid(client.port)

    rng = random.Random(args.seed)
    # Ids from the low 90% of the vocabulary: special tokens sit at the end.
    id_range = max(1, int(vocab * 0.9))

    system = [rng.randrange(id_range) for _ in range(args.system_tokens)] if shared else []

    def request_body():
        return {
            "model": model,
            "prompt": system + [rng.randrange(id_range) for _ in range(args.prompt_tokens)],
            "max_tokens": args.output_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }

    for _ in range(args.warmup):
        client.stream(request_body())
    counters_before = prefix_counters(client)

    lock = threading.Lock()
    bodies = [request_body() for _ in range(args.requests)]
    results = []
    failures = []

    def worker():
        c = Client(args.url, args.api_key)
        while True:
            with lock:
                if not bodies:
                    return
                body = bodies.pop()
            try:
                outcome = c.stream(body)
            except Exception as e:  # noqa: BLE001 - every failure is reported
                with lock:
                    failures.append(str(e))
                c.conn = None
                continue
            with lock:
                results.append(outcome)

    threads = [threading.Thread(target=worker) for _ in range(args.clients)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - began
    counters_after = prefix_counters(client)

    ttft = []
    itl = []
    output_tokens = 0
    prompt_tokens = 0
    cached = 0
    cached_reported = bool(results)
    for start, arrivals, usage in results:
        prompt_tokens += (usage or {}).get("prompt_tokens", prompt_len)
        c = cached_tokens(usage)
        cached_reported = cached_reported and c is not None
        cached += c or 0
        if usage is not None:
            output_tokens += usage["completion_tokens"]
        else:
            output_tokens += sum(n for _, n in arrivals)
        if arrivals:
            ttft.append(arrivals[0][0] - start)
        previous = arrivals[0][0] if arrivals else None
        for at, tokens in arrivals[1:]:
            # A chunk carrying k tokens (text held back) stands for k gaps.
            itl.extend([(at - previous) / tokens] * tokens)
            previous = at

    figures = {
        "model": model,
        "clients": args.clients,
        "requests": len(results),
        "failed": len(failures),
        "workload": args.workload,
        "prompt_tokens": prompt_len,
        "system_tokens": args.system_tokens if shared else 0,
        "output_tokens_per_request": args.output_tokens,
        "wall_s": wall,
        "requests_per_s": len(results) / wall,
        "output_tok_per_s": output_tokens / wall,
        "ttft_p50_ms": percentile(ttft, 50) * 1e3,
        "ttft_p99_ms": percentile(ttft, 99) * 1e3,
        "itl_p50_ms": percentile(itl, 50) * 1e3,
        "itl_p99_ms": percentile(itl, 99) * 1e3,
        "plan_total_bytes": plan_total,
        "server_pid": pid,
    }
    shape = f"{args.system_tokens} shared + {args.prompt_tokens}" if shared else f"{args.prompt_tokens}"
    print(f"model {model}: {args.workload} workload, {args.clients} clients, {len(results)} requests "
          f"({len(failures)} failed), {shape} prompt + {args.output_tokens} output tokens each")
    print(f"  wall               {wall:10.2f} s")
    print(f"  requests/s         {figures['requests_per_s']:10.2f}")
    print(f"  output tok/s       {figures['output_tok_per_s']:10.1f}")
    print(f"  TTFT p50 / p99     {figures['ttft_p50_ms']:10.1f} / {figures['ttft_p99_ms']:.1f} ms")
    print(f"  ITL  p50 / p99     {figures['itl_p50_ms']:10.1f} / {figures['itl_p99_ms']:.1f} ms")
    if shared:
        # Hit rate by the answers' usage: 0 where the server does not say
        # (a server without prefix caching serves no cached tokens).
        hit_rate = cached / prompt_tokens if cached_reported and prompt_tokens else None
        figures.update({"cached_tokens": cached if cached_reported else None,
                        "hit_rate": hit_rate})
        if hit_rate is None:
            print("  hit rate (usage)   not reported (no usage.prompt_tokens_details.cached_tokens): 0")
        else:
            print(f"  hit rate (usage)   {100 * hit_rate:10.1f} %  ({cached} of {prompt_tokens} prompt tokens cached)")
        if counters_before is None or counters_after is None:
            print("  hit rate (metrics) not reported (no sparkrt_prefix_cache_* counters in /metrics)")
        else:
            queries = counters_after[PREFIX_COUNTERS[0]] - counters_before[PREFIX_COUNTERS[0]]
            hits = counters_after[PREFIX_COUNTERS[1]] - counters_before[PREFIX_COUNTERS[1]]
            figures.update({"prefix_cache_queries": queries, "prefix_cache_hits": hits})
            rate = f"{100 * hits / queries:10.1f} %" if queries else "       n/a"
            print(f"  hit rate (metrics) {rate}  ({hits:.0f} hit of {queries:.0f} queried tokens)")
    ok = not failures
    for message in failures[:5]:
        print(f"  failure: {message}", file=sys.stderr)
    if pid is None:
        print("  peak RSS           unknown (server process not found; pass --pid)")
    else:
        peak = status_bytes(pid, "VmHWM")
        rss = status_bytes(pid, "VmRSS")
        limit = plan_total * RSS_TOLERANCE
        within = peak <= limit
        ok = ok and within
        figures.update({"peak_rss_bytes": peak, "rss_bytes": rss, "rss_within_plan": within})
        gib = 1 << 30
        print(f"  peak RSS (VmHWM)   {peak / gib:10.3f} GiB  (now {rss / gib:.3f} GiB)")
        print(f"  plan total         {plan_total / gib:10.3f} GiB  -> peak is "
              f"{100 * peak / plan_total:.1f}% of it: {'within' if within else 'OVER'} total + 5%")
    figures["ok"] = ok
    if args.json:
        print(json.dumps(figures))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(figures, f)
            f.write("\n")
    sys.exit(0 if ok else 1)


# What two compared runs must share to be comparable.
SAME_WORKLOAD = ("model", "workload", "clients", "requests", "prompt_tokens", "system_tokens",
                 "output_tokens_per_request")


def read_figures(path):
    """The last line of `path` that is a JSON object: a --json-out file, or
    the whole output of a run with --json."""
    with open(path) as f:
        rows = f.read().splitlines()
    for row in reversed(rows):
        row = row.strip()
        if row.startswith("{"):
            try:
                return json.loads(row)
            except ValueError:
                continue
    raise SystemExit(f"{path}: no JSON figures (write them with --json-out or --json)")


def compare(with_path, without_path):
    """Prints two runs side by side; returns the exit status."""
    on, off = read_figures(with_path), read_figures(without_path)
    ok = on.get("ok", True) and off.get("ok", True)
    for key in SAME_WORKLOAD:
        if on.get(key) != off.get(key):
            print(f"runs differ in {key}: {on.get(key)!r} (with) vs {off.get(key)!r} (without)",
                  file=sys.stderr)
            ok = False
    shape = (f"{on.get('system_tokens')} shared + {on.get('prompt_tokens', 0) - on.get('system_tokens', 0)}"
             if on.get("workload") == "shared-prefix" else f"{on.get('prompt_tokens')}")
    print(f"model {on.get('model')}: {on.get('workload')} workload, {on.get('clients')} clients, "
          f"{on.get('requests')} requests, {shape} prompt + {on.get('output_tokens_per_request')} "
          f"output tokens each")
    print(f"  {'':20} {'with cache':>12} {'without':>12} {'without/with':>13}")

    def rate(f, hits, queries):
        if f.get(queries):
            return f"{100 * f[hits] / f[queries]:.1f} %"
        return "n/a" if queries in f else "not reported"

    def usage_rate(f):
        return "not reported" if f.get("hit_rate") is None else f"{100 * f['hit_rate']:.1f} %"

    print(f"  {'hit rate (usage)':20} {usage_rate(on):>12} {usage_rate(off):>12}")
    print(f"  {'hit rate (metrics)':20} {rate(on, 'prefix_cache_hits', 'prefix_cache_queries'):>12} "
          f"{rate(off, 'prefix_cache_hits', 'prefix_cache_queries'):>12}")
    rows = [("TTFT p50 (ms)", "ttft_p50_ms"), ("TTFT p99 (ms)", "ttft_p99_ms"),
            ("ITL p50 (ms)", "itl_p50_ms"), ("ITL p99 (ms)", "itl_p99_ms"),
            ("output tok/s", "output_tok_per_s"), ("requests/s", "requests_per_s"),
            ("wall (s)", "wall_s")]
    for label, key in rows:
        a, b = on.get(key), off.get(key)
        if a is None or b is None:
            print(f"  {label:20} {'missing':>12} {'missing':>12}")
            continue
        ratio = f"{b / a:12.2f}x" if a else ""
        print(f"  {label:20} {a:12.1f} {b:12.1f} {ratio}")
    gib = 1 << 30
    peaks = [f.get("peak_rss_bytes") for f in (on, off)]
    plans = [f.get("plan_total_bytes") for f in (on, off)]
    if None in peaks:
        print("  peak RSS             unknown in a run (server process not found)")
    else:
        print(f"  {'peak RSS (GiB)':20} {peaks[0] / gib:12.3f} {peaks[1] / gib:12.3f} "
              f"{peaks[1] / peaks[0]:12.3f}x")
        print(f"  {'plan total (GiB)':20} {plans[0] / gib:12.3f} {plans[1] / gib:12.3f}")
        print(f"  {'peak / plan':20} {100 * peaks[0] / plans[0]:10.1f} % {100 * peaks[1] / plans[1]:10.1f} %")
        same = "the same in both runs" if plans[0] == plans[1] else "DIFFERENT (caching must not change it)"
        print(f"  plan total is {same}; peak RSS with caching against without: "
              f"{100 * (peaks[0] - peaks[1]) / peaks[1]:+.2f}%")
    return 0 if ok else 1


if __name__ == "__main__":
    main()
