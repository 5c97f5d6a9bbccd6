#!/usr/bin/env bash
# Prints the directory holding libnvrtc.so.13 from the `nvidia-cuda-nvrtc`
# pip package (system or user site-packages); prints nothing if absent.
set -euo pipefail
python3 - <<'PY' 2>/dev/null || true
import os, site, sysconfig
for base in [sysconfig.get_paths()["purelib"], site.getusersitepackages()]:
    lib = os.path.join(base, "nvidia", "cu13", "lib")
    if os.path.isfile(os.path.join(lib, "libnvrtc.so.13")):
        print(lib)
        break
PY
