#pragma once
// CPU backend: OpenMP over rows, fp32 accumulation. Every output row is computed by one thread in a
// fixed order, so results do not depend on the thread count. Inputs arrive validated by src/api;
// each file registers its implementations (src/registry/registry.cpp lists them).
#include "m3sa/ops.h"

namespace m3sa::cpu {

// The thread count a plan is sized for: the request's, or OpenMP's default.
int plan_threads(const PlanRequest& request);

} // namespace m3sa::cpu
