#!/usr/bin/env bash
# Speculative decoding side by side: `sparkrt bench` without drafts and with
# them (n-gram drafts, k = 3, unless SPEC gives another --speculative-config,
# e.g. SPEC='{"method": "mtp", "num_speculative_tokens": 1}' for a checkpoint
# with an MTP head), in interleaved rounds, printing each run's decode tok/s
# and tokens per decode pass, then the medians and their ratio.
#
#   [SPEC=JSON] scripts/spec-decode-bench.sh MODEL_DIR [ROUNDS] [EXTRA BENCH FLAGS...]
#
# MODEL_DIR is a checkpoint folder (add `--load-format dummy` for a bench
# model made with `sparkrt make-checkpoint --like`). `--prompt repeat`
# gives prompts that repeat a 32-token phrase (drafts can hold once the
# model repeats it); the default random prompts show what verifying drafts
# that fail costs, with the proposer backing off.
set -euo pipefail
cd "$(dirname "$0")/.."

model=${1:?usage: scripts/spec-decode-bench.sh MODEL_DIR [ROUNDS] [BENCH FLAGS...]}
rounds=${2:-3}
shift $(($# >= 2 ? 2 : 1))
bin=target/release/sparkrt
[[ -x $bin ]] || cargo build --release --quiet

spec=${SPEC:-'{"method": "ngram", "num_speculative_tokens": 3}'}
declare -a off on
for ((r = 1; r <= rounds; r++)); do
	for mode in off on; do
		flags=()
		[[ $mode == on ]] && flags=(--speculative-config "$spec")
		json=$("$bin" bench --model "$model" --json --repeats 1 "${flags[@]}" "$@")
		line=$(python3 -c 'import json,sys; r=json.load(sys.stdin); s=r.get("speculative") or {}; print(r["decode_tok_s"], r["tokens_per_decode_pass"], s.get("accepted_tokens", 0), s.get("draft_tokens", 0))' <<<"$json")
		read -r tok_s per_pass kept drafted <<<"$line"
		echo "round $r $mode: decode $tok_s tok/s, $per_pass tokens/pass, drafts kept $kept of $drafted"
		if [[ $mode == on ]]; then on+=("$tok_s"); else off+=("$tok_s"); fi
	done
done
python3 - "${off[*]}" "${on[*]}" "$spec" <<'PY'
import json, statistics, sys
off = [float(x) for x in sys.argv[1].split()]
on = [float(x) for x in sys.argv[2].split()]
spec = json.loads(sys.argv[3])
label = f"{spec['method']} k={spec['num_speculative_tokens']}"
m_off, m_on = statistics.median(off), statistics.median(on)
print(f"median decode: off {m_off:.2f} tok/s, {label} {m_on:.2f} tok/s, ratio {m_on / m_off:.3f}")
PY
