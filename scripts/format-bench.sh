#!/usr/bin/env bash
# Decode speed per weight format, side by side: one Qwen3-30B-A3B-shaped
# bench model (benches/models/qwen3-30b-a3b-8l, cut to LAYERS layers) made
# by `sparkrt make-checkpoint` in each format, then `sparkrt bench` on each
# in interleaved rounds (every round runs every format once, so machine
# noise falls on all of them alike). Prints per format the median decode
# tok/s, weight bytes read per token, the share of the bandwidth roofline
# measured in the same run, and the ratio to bf16.
#
#   scripts/format-bench.sh [--rounds N] [--layers L] [--gen M] [--formats "bf16 nvfp4 ..."]
#                           [--isas "avx2 avx512"] [--keep DIR]
#
# --isas runs every format on each named CPU kernel tier (SPARKRT_ISA) in
# the same rounds, and prints a row per format and tier (the ratio is to
# bf16 on the same tier).
#
# Formats: bf16, nvfp4 (ModelOpt: experts in NVFP4), ct-nvfp4
# (compressed-tensors nvfp4-pack-quantized: every linear but the router and
# lm_head), modelopt-mixed (NVIDIA's Qwen3.6 layout: NVFP4 experts and
# lm_head, FP8 attention), int4 (GPTQ as Intel's AutoRound: every linear but
# the router and lm_head), int4-experts, fp8-block: whatever
# scripts/format-configs.py knows (it writes each format's
# quantization_config). The checkpoints take about
# 1.3 GB × LAYERS in bf16 and a third of that in 4-bit; --keep reuses them.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=5
layers=2
gen=32
formats="bf16 nvfp4 ct-nvfp4"
isas=""
keep=""
while (($#)); do
	case "$1" in
	--rounds) rounds="$2"; shift 2 ;;
	--layers) layers="$2"; shift 2 ;;
	--gen) gen="$2"; shift 2 ;;
	--formats) formats="$2"; shift 2 ;;
	--isas) isas="$2"; shift 2 ;;
	--keep) keep="$2"; shift 2 ;;
	*) echo "unknown argument $1" >&2; exit 2 ;;
	esac
done

cargo build --release --quiet
bin=target/release/sparkrt
work="${keep:-$(mktemp -d)}"
mkdir -p "$work"
[[ -n "$keep" ]] || trap 'rm -rf "$work"' EXIT

for format in $formats; do
	dir="$work/$format"
	if [[ -f "$dir/model.safetensors" || -f "$dir/model.safetensors.index.json" ]]; then
		continue
	fi
	like="$work/like-$format"
	rm -rf "$like" "$dir"
	mkdir -p "$like"
	python3 scripts/format-configs.py benches/models/qwen3-30b-a3b-8l/config.json \
		"$format" "$layers" >"$like/config.json"
	echo "making the $format checkpoint ($layers layers)" >&2
	"$bin" make-checkpoint --like "$like" --out "$dir" --shards 1 >/dev/null 2>&1
done

results="$work/results.jsonl"
: >"$results"
for round in $(seq 1 "$rounds"); do
	for format in $formats; do
		for isa in ${isas:-default}; do
			if [[ "$isa" == default ]]; then label="$format"; else label="$format/$isa"; fi
			SPARKRT_ISA="${isa#default}" "$bin" bench --model "$work/$format" --prompt-len 16 --gen "$gen" --json 2>/dev/null |
				python3 -c 'import json,sys; r=json.load(sys.stdin); r["format"]=sys.argv[1]; r["round"]=int(sys.argv[2]); print(json.dumps(r))' \
					"$label" "$round" >>"$results"
		done
	done
	echo "round $round of $rounds done" >&2
done

python3 - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
formats = list(dict.fromkeys(r["format"] for r in rows))
def median(f, key):
    values = [r[key] for r in rows if r["format"] == f and r.get(key) is not None]
    return statistics.median(values) if values else None
print(f"{'format':<17} {'decode tok/s':>13} {'MB/token':>10} {'roofline':>9} {'vs bf16':>8}")
for f in formats:
    tier = f.partition("/")[2]
    base = median("bf16/" + tier if tier else "bf16", "decode_tok_s")
    tps, bpt, share = median(f, "decode_tok_s"), median(f, "bytes_per_token"), median(f, "roofline_fraction")
    mb = f"{bpt / 1e6:.1f}" if bpt else "?"
    sh = f"{share:.0%}" if share is not None else "?"
    ratio = f"{tps / base:.2f}x" if base and tps else "?"
    print(f"{f:<17} {tps or 0:>13.2f} {mb:>10} {sh:>9} {ratio:>8}")
print(f"({len(rows) // max(len(formats), 1)} interleaved rounds, medians of each bench's own repeat medians)")
EOF
