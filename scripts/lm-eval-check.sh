#!/usr/bin/env bash
# lm-evaluation-harness as a real client of `sparkrt serve` (not in CI: it
# installs lm-eval and its dependencies, a few hundred MB).
#
# Installs lm-eval in a virtual environment if it is missing, starts the
# server on the tiny fixture (random weights), and runs lm_eval's
# `local-completions` model on a small multiple-choice task read from a local
# JSON-lines file (scripts/lm-eval/tiny_mc.jsonl): every choice is a
# loglikelihood request (`echo: true, logprobs: 1, max_tokens: 1`, prompts as
# lists of token ids). Nothing is downloaded at run time (HF_*_OFFLINE). The
# score means nothing on random weights; that the requests are answered and a
# score comes out is the check.
#
# Usage: scripts/lm-eval-check.sh   (LM_EVAL_VENV=DIR to choose the venv)
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="${LM_EVAL_VENV:-$HOME/.cache/sparkrt/lm-eval-venv}"
fixture="$repo/tests/fixtures/qwen3-moe-tiny"
work="$(mktemp -d)"
server_pid=""
cleanup() {
	if [ -n "$server_pid" ]; then
		kill "$server_pid" 2>/dev/null || true
		wait "$server_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

if [ ! -x "$venv/bin/lm_eval" ]; then
	echo "lm-eval-check: installing lm-eval into $venv"
	python3 -m venv "$venv"
	"$venv/bin/pip" install --quiet --upgrade pip
	# The API client extra and transformers for the tokenizer; no torch.
	"$venv/bin/pip" install --quiet "lm-eval[api]" transformers
fi

echo "lm-eval-check: building sparkrt"
cargo build --quiet --manifest-path "$repo/Cargo.toml" --bin sparkrt
"$repo/target/debug/sparkrt" serve --port 0 --host-root "$repo/tests/fixtures/hosts/box24" \
	--model "$fixture" 2>"$work/server.log" &
server_pid=$!
url=""
for _ in $(seq 1 600); do
	url="$(sed -n 's/^sparkrt: listening on //p' "$work/server.log" | head -n 1)"
	if [ -n "$url" ] && curl -fsS "$url/ready" >/dev/null 2>&1; then
		break
	fi
	if ! kill -0 "$server_pid" 2>/dev/null; then
		cat "$work/server.log" >&2
		echo "lm-eval-check: the server exited" >&2
		exit 1
	fi
	sleep 0.2
done
[ -n "$url" ] || { echo "lm-eval-check: the server never listened" >&2; exit 1; }
model="$(curl -fsS "$url/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')"
echo "lm-eval-check: serving $model at $url"

# The task: the local JSON-lines file through datasets' packaged json loader.
mkdir -p "$work/tasks"
cat >"$work/tasks/sparkrt_tiny_mc.yaml" <<YAML
task: sparkrt_tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: $repo/scripts/lm-eval/tiny_mc.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{{question}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
YAML

export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME="$work/hf"
"$venv/bin/lm_eval" run \
	--model local-completions \
	--model_args "model=$model,base_url=$url/v1/completions,tokenizer_backend=huggingface,tokenizer=$fixture,num_concurrent=1,max_retries=1" \
	--include_path "$work/tasks" \
	--tasks sparkrt_tiny_mc \
	--batch_size 1 \
	--output_path "$work/out"
stats="$(curl -fsS "$url/v1/stats" | python3 -c 'import json,sys; r=json.load(sys.stdin)["requests"]; print(r["ok"], "answered,", r["error"], "failed,", r["rejected"], "rejected")')"
echo "lm-eval-check: done; the server counted $stats"
