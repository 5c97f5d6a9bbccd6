#!/usr/bin/env bash
# Installs the command-line tools and Python packages CI's tests use, when
# they are missing: `command package` pairs, installed with apt-get, and
# `module package` pairs, installed with pip. Tests that need one skip with
# their reason on a developer's machine that lacks it, and fail under CI
# (`CI` set: tests/common's `tool_present`), so a skip never passes there.
set -euo pipefail

readonly TOOLS=(
	"shellcheck shellcheck"   # tests/install_script.rs lints install.sh
	"tmux tmux"               # tests/top_tmux.rs drives sparkrt top in a terminal
	"systemd-analyze systemd" # tests/install_script.rs verifies the unit
	"g++ g++"                 # .ci/run builds the CUDA emulator (kernels/emu) for scripts/cuda-emulator-check.sh
)

readonly PYTHON_PACKAGES=(
	"openai openai" # tests/server_openai_client.rs and server_responses.rs run scripts/openai_*_check.py
	"langchain_openai langchain-openai" # tests/chat_parsers.rs: bind_tools(...).invoke; tests/server_tool_choice.rs: with_structured_output
	"instructor instructor" # tests/server_tool_choice.rs: Mode.TOOLS (named tool_choice)
	"pydantic_ai pydantic-ai-slim[openai]" # tests/server_tool_choice.rs: output_type=Model (tool_choice required)
	"numpy numpy"                       # tests/chat_parsers.rs: scripts/scripted_reference.py
	"transformers transformers"         # (no torch: config, tokenizer and template only)
	"jsonschema jsonschema" # tests/server_sampling.rs runs scripts/structured_output_check.py
	"prometheus_client prometheus-client" # tests/server_metrics.rs parses /metrics
)

install_tools() {
	local missing=() pair command package
	for pair in "${TOOLS[@]}"; do
		read -r command package <<<"$pair"
		if ! command -v "$command" >/dev/null 2>&1; then
			missing+=("$package")
		fi
	done
	if ((${#missing[@]} == 0)); then
		echo "ci-deps: all tools present"
		return
	fi
	if ((EUID != 0)) || ! command -v apt-get >/dev/null 2>&1; then
		echo "ci-deps: cannot install ${missing[*]} (needs root and apt-get); their tests will fail under CI" >&2
		return
	fi
	echo "ci-deps: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	# Said here; the tests that need the tools then fail under CI.
	if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; }; then
		echo "ci-deps: apt-get could not install ${missing[*]}; their tests will fail under CI" >&2
	fi
}

install_python_packages() {
	if ! command -v python3 >/dev/null 2>&1; then
		echo "ci-deps: no python3; the Python client tests will fail under CI" >&2
		return
	fi
	local missing=() pair module package
	for pair in "${PYTHON_PACKAGES[@]}"; do
		read -r module package <<<"$pair"
		if ! python3 -c "import $module" >/dev/null 2>&1; then
			missing+=("$package")
		fi
	done
	if ((${#missing[@]} == 0)); then
		echo "ci-deps: all Python packages present"
		return
	fi
	echo "ci-deps: installing Python packages ${missing[*]}"
	if ! python3 -m pip install --quiet --disable-pip-version-check "${missing[@]}"; then
		echo "ci-deps: pip could not install ${missing[*]}; their tests will fail under CI" >&2
	fi
}

# NVRTC (the `nvidia-cuda-nvrtc` pip package: libnvrtc.so.13, no GPU or CUDA
# toolkit needed) for `sparkrt kernels`, which compiles every CUDA kernel.
install_nvrtc() {
	if ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so'; then
		echo "ci-deps: NVRTC present (system)"
		return
	fi
	if [[ -n "$(bash "$(dirname "$0")/nvrtc-dir.sh" 2>/dev/null)" ]]; then
		echo "ci-deps: NVRTC present (pip)"
		return
	fi
	echo "ci-deps: installing nvidia-cuda-nvrtc (pip)"
	if ! python3 -m pip install --quiet --disable-pip-version-check nvidia-cuda-nvrtc; then
		echo "ci-deps: pip could not install nvidia-cuda-nvrtc; the kernel compile tests will fail under CI" >&2
	fi
}

# cuobjdump and the nvdisasm it runs (pip `nvidia-cuda-cuobjdump` and
# `nvidia-cuda-nvdisasm`, into nvidia/cu13/bin) for tests/cuda_sass.rs and
# `sparkrt kernels`' SASS columns.
install_cuobjdump() {
	if command -v cuobjdump >/dev/null 2>&1 && command -v nvdisasm >/dev/null 2>&1; then
		echo "ci-deps: cuobjdump present (system)"
		return
	fi
	if [[ -n "$(bash "$(dirname "$0")/cuobjdump-path.sh" 2>/dev/null)" ]]; then
		echo "ci-deps: cuobjdump present (pip)"
		return
	fi
	echo "ci-deps: installing nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm (pip)"
	if ! python3 -m pip install --quiet --disable-pip-version-check nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm; then
		echo "ci-deps: pip could not install cuobjdump; the SASS tests will fail under CI" >&2
	fi
}

install_tools
install_python_packages
install_nvrtc
install_cuobjdump
