#include "shim.h"
#include "../attention.cu"
EMU_KERNEL(attention, AttnParams)
EMU_KERNEL(attention_combine, AttnParams)
EMU_KERNEL(kv_append, AppendParams)
EMU_KERNEL(kv_copy_blocks, CopyParams)
