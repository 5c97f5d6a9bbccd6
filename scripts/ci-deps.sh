#!/usr/bin/env bash
# Installs the command-line tools CI's tests use, when they are missing:
# `command package` pairs, installed with apt-get. Tests that need a tool
# still skip with a reason where it cannot be had (not root, no apt-get).
set -euo pipefail

readonly TOOLS=(
	"shellcheck shellcheck" # tests/install_script.rs lints install.sh
)

# NVRTC (the `nvidia-cuda-nvrtc` pip package: libnvrtc.so.13, no GPU or CUDA
# toolkit needed) for `sparkrt kernels`, which compiles every CUDA kernel.
nvrtc_dir() {
	python3 - <<'PY' 2>/dev/null
import os, site, sysconfig
for base in [sysconfig.get_paths()["purelib"], site.getusersitepackages()]:
    lib = os.path.join(base, "nvidia", "cu13", "lib")
    if os.path.isfile(os.path.join(lib, "libnvrtc.so.13")):
        print(lib)
        break
PY
}
if [[ -z "$(nvrtc_dir)" ]] && ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so'; then
	echo "ci-deps: installing nvidia-cuda-nvrtc (pip)"
	if ! python3 -m pip install --quiet nvidia-cuda-nvrtc; then
		echo "ci-deps: pip could not install nvidia-cuda-nvrtc; the kernel compile check will skip" >&2
	fi
fi

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
