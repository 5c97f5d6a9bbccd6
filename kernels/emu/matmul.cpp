#include "shim.h"
#include "../matmul.cu"
EMU_KERNEL(matmul, MatmulParams)
