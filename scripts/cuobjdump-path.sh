#!/usr/bin/env bash
# Prints the path of `cuobjdump` from the `nvidia-cuda-cuobjdump` pip package
# (system or user site-packages), when the `nvdisasm` it runs (pip
# `nvidia-cuda-nvdisasm`) lies beside it; prints nothing otherwise.
set -euo pipefail
python3 - <<'PY' 2>/dev/null || true
import os, site, sysconfig
for base in [sysconfig.get_paths()["purelib"], site.getusersitepackages()]:
    bin_dir = os.path.join(base, "nvidia", "cu13", "bin")
    tool = os.path.join(bin_dir, "cuobjdump")
    if os.path.isfile(tool) and os.path.isfile(os.path.join(bin_dir, "nvdisasm")):
        print(tool)
        break
PY
