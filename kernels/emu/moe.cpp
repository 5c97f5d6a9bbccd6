#include "shim.h"
#include "../moe.cu"
EMU_KERNEL(route_group, RouteParams)
EMU_KERNEL(expert_gate_up, GateUpParams)
EMU_KERNEL(expert_down, DownParams)
EMU_KERNEL(moe_combine, CombineParams)
