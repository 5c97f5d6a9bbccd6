#!/usr/bin/env bash
# Installs the command-line tools CI's tests use, when they are missing:
# `command package` pairs, installed with apt-get. Tests that need a tool
# still skip with a reason where it cannot be had (not root, no apt-get).
set -euo pipefail

readonly TOOLS=(
	"shellcheck shellcheck" # tests/install_script.rs lints install.sh
	"tmux tmux"             # tests/top_tmux.rs drives sparkrt top in a terminal
)

missing=()
for pair in "${TOOLS[@]}"; do
	read -r command package <<<"$pair"
	if ! command -v "$command" >/dev/null 2>&1; then
		missing+=("$package")
	fi
done

if ((${#missing[@]} == 0)); then
	echo "ci-deps: all tools present"
	exit 0
fi
if ((EUID != 0)) || ! command -v apt-get >/dev/null 2>&1; then
	echo "ci-deps: cannot install ${missing[*]} (needs root and apt-get); their tests will skip" >&2
	exit 0
fi
echo "ci-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# A registry that cannot be reached makes the tests skip, not CI fail.
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; }; then
	echo "ci-deps: apt-get could not install ${missing[*]}; their tests will skip" >&2
fi
