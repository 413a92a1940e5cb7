#pragma once
// The CUDA layer's shared host side, callable from plain C++ (streams travel as void*): the
// device's capabilities, what every CUDA implementation requires of a request, and the control
// area at the start of every CUDA workspace.
#include <cstdint>

#include "common/workspace.h"
#include "m3sa/ops.h"
#include "registry/registry.h"

namespace m3sa::cuda {

int visible_device_count();
detail::DeviceCaps read_device_caps(int ordinal);

// What the portable (mma.sync, SM80+) kernels need: a visible device of compute capability 8.0
// or newer, and no reduce_heads mode (they select per head).
Status can_run_sm80(const PlanRequest& request, const detail::DeviceCaps& caps);
// What an sm_90a implementation needs beyond that: compute capability 9.0 exactly (sm_90a code
// runs nowhere else) and a binary that carries its kernels' sm_90a code (`has_sm90a_code`);
// `kernels` names them in the refusal.
Status can_run_sm90a(const PlanRequest& request, const detail::DeviceCaps& caps,
                     bool has_sm90a_code, const char* kernels);

// Control state at the start of every CUDA workspace, zeroed once by prepare_workspace and never
// per run (a reset per run would be one more graph node, ~2 us at batch 1):
// [prepared mark: 2 int32][error flag][pad][arrival counters...]. The flag accumulates until
// read_device_errors clears it; split reductions leave their arrival counters at zero.
struct ControlArea {
  int32_t* control = nullptr;     // the region prepare_workspace initialises
  int32_t* error_flags = nullptr; // [1]
  int32_t* arrivals = nullptr;    // [arrival counters]
  int64_t bytes = 0;
};
ControlArea take_control_area(detail::WorkspaceCarver& carver, int64_t arrival_counters);
Status initialise_control_area(const ControlArea& control, void* stream);

// prepare_workspace of implementations whose control area has no arrival counters, and
// read_device_errors of every CUDA implementation (the flag sits at the same place in each).
Status prepare_control_area(const OpPlan& plan, Workspace workspace, void* stream);
Status read_control_errors(const OpPlan& plan, Workspace workspace, void* stream, int32_t* flags);

} // namespace m3sa::cuda
