#include "shim.h"
#include "../elementwise.cu"
EMU_KERNEL(embed, EmbedParams)
EMU_KERNEL(silu_mul, PairParams)
EMU_KERNEL(add, PairParams)
EMU_KERNEL(compact_rows, CompactParams)
