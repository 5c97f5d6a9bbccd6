#include "shim.h"
#include "../norm.cu"
EMU_KERNEL(rmsnorm, NormParams)
EMU_KERNEL(rope_table, RopeTableParams)
EMU_KERNEL(qk_norm_rope, QkRopeParams)
