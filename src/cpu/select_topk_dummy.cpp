// A stand-in implementation that shows what adding one touches: this file, the registry lines and
// the CMake list. It delegates to cpu.select_topk_blocks and ranks below it.
#include <variant>

#include "registry/registry.h"

namespace m3sa::detail {

extern const Implementation kCpuSelectTopkBlocks, kCpuSelectTopkBlocksDummy;

namespace {
Status plan(const PlanRequest& request, const DeviceCaps& caps, OpPlan* plan) {
  return kCpuSelectTopkBlocks.plan(request, caps, plan);
}
Status run(const OpPlan& plan, const SelectTopkBlocksArgs& args, Workspace workspace,
           const ExecContext& ctx) {
  return std::get<RunFnOf<SelectTopkBlocksArgs>>(kCpuSelectTopkBlocks.run)(plan, args, workspace,
                                                                           ctx);
}
} // namespace

const Implementation kCpuSelectTopkBlocksDummy = [] {
  Implementation impl =
      host_implementation("cpu.select_topk_blocks.dummy", "cpu.select_topk_blocks, delegated",
                          Backend::cpu, OpKind::select_topk_blocks, plan, run);
  impl.priority = -1;
  return impl;
}();

} // namespace m3sa::detail
