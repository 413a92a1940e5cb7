#pragma once
// The implementations this build registers: one entry per kernel family of an op on a backend
// (reference.index_topk, cpu.index_topk, cuda.index_topk.sm80, ...). make_plan picks the
// best one that can run a request, or the one PlanRequest::implementation names; the plan's
// implementation_name() says which it was.
#include "m3sa/ops.h"
#include "m3sa/status.h"
#include "m3sa/types.h"

namespace m3sa {

struct ImplementationInfo {
  const char* name = ""; // public id, e.g. "cuda.score_blocks.sm80"
  Backend backend = Backend::reference;
  OpKind op = OpKind::index_topk;
  const char* description = "";
};

int implementation_count();
// Entry `index` in [0, implementation_count()); outside it, an info with empty name.
ImplementationInfo implementation_info(int index);
// OK when implementation `index` can run `request` here (request.op and request.backend are taken
// from the implementation); otherwise unsupported with the reason.
Status implementation_supports(int index, const PlanRequest& request);

} // namespace m3sa
