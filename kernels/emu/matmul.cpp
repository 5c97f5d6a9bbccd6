#include "shim.h"
#include "../matmul.cu"
EMU_KERNEL(matmul, MatmulParams)
EMU_KERNEL(matmul_mma, MatmulParams)
