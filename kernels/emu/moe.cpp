#include "shim.h"
#include "../moe.cu"
EMU_KERNEL(route_group, RouteParams)
EMU_KERNEL(expert_gate_up, GateUpParams)
EMU_KERNEL(expert_gate_up_mma, GateUpParams)
EMU_KERNEL(expert_down, DownParams)
EMU_KERNEL(expert_down_mma, DownParams)
EMU_KERNEL(moe_combine, CombineParams)
