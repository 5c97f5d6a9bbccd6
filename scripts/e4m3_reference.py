#!/usr/bin/env python3
"""Regenerates tests/data/e4m3_encode_runs.txt: torch's saturating f32 ->
FP8 E4M3 conversion, `torch.clamp(x, -448, 448).to(torch.float8_e4m3fn)`,
of every one of the 2^32 f32 bit patterns, as runs.

The conversion is a step function of the bits (for either sign, larger
bits are larger magnitudes, and NaNs sit at the end of each half), so the
whole table is its change points: one line `FIRST_BITS BYTE` (hex) per run,
in bit order; a run lasts until the next line's bits. tests/formats.rs
walks all 2^32 bit patterns and checks `sparkrt::formats::f32_to_e4m3`
against these runs.

Needs torch and numpy: python3 scripts/e4m3_reference.py [OUT]
"""

import sys

import numpy as np
import torch

CHUNK = 1 << 24


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/e4m3_encode_runs.txt"
    runs = []
    previous = None
    for start in range(0, 1 << 32, CHUNK):
        bits = np.arange(start, start + CHUNK, dtype=np.uint64).astype(np.uint32)
        values = torch.from_numpy(bits.view(np.float32))
        encoded = values.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
        changes = np.flatnonzero(np.diff(encoded)) + 1
        if previous is None or encoded[0] != previous:
            runs.append((start, int(encoded[0])))
        runs.extend((start + int(i), int(encoded[i])) for i in changes)
        previous = encoded[-1]
    with open(out, "w", encoding="ascii") as f:
        f.write(
            "# torch %s: torch.clamp(x, -448, 448).to(torch.float8_e4m3fn) of every\n"
            "# f32 bit pattern, as runs: FIRST_BITS BYTE (hex); regenerate with\n"
            "# scripts/e4m3_reference.py\n" % torch.__version__
        )
        for first, byte in runs:
            f.write("%08x %02x\n" % (first, byte))
    print("%d runs written to %s" % (len(runs), out))


if __name__ == "__main__":
    main()
