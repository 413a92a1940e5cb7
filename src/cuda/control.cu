// The CUDA layer's shared host side: device capabilities, the SM80 requirements, and the control
// area every CUDA workspace starts with.
#include <cstring>
#include <mutex>
#include <vector>

#include "cuda/control.h"
#include "cuda/kernels/common.cuh"
#include "cuda/launch.h"

namespace m3sa::cuda {
namespace {

constexpr int64_t kFlagOffset = 2;            // int32s
constexpr int64_t kArrivalsOffset = 16;       // int32s: the counters start a 64-byte line
constexpr unsigned char kPreparedByte = 0xa5; // prepare_workspace writes 8 of them

// What set_launch_attributes (kernels/common.cuh) has set, per kernel and device: a few dozen
// entries at most (one per kernel instantiation a process launches, per device), so a vector.
struct LaunchAttributes {
  const void* kernel;
  int device, smem;
  bool nonportable_cluster;
};
std::mutex launch_attributes_mutex;
std::vector<LaunchAttributes> launch_attributes;

} // namespace

bool launch_attributes_recorded(const void* kernel, int device, int smem,
                                bool nonportable_cluster) {
  const std::lock_guard<std::mutex> lock(launch_attributes_mutex);
  for (const LaunchAttributes& a : launch_attributes)
    if (a.kernel == kernel && a.device == device)
      return a.smem >= smem && (a.nonportable_cluster || !nonportable_cluster);
  return false;
}

void record_launch_attributes(const void* kernel, int device, int smem, bool nonportable_cluster) {
  const std::lock_guard<std::mutex> lock(launch_attributes_mutex);
  for (LaunchAttributes& a : launch_attributes)
    if (a.kernel == kernel && a.device == device) {
      // The shared-memory attribute is a maximum the launch may use: the last one set counts.
      a.smem = smem;
      a.nonportable_cluster = a.nonportable_cluster || nonportable_cluster;
      return;
    }
  launch_attributes.push_back({kernel, device, smem, nonportable_cluster});
}

int visible_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError(); // no driver (the CPU-only build machine) or no device: zero devices
    return 0;
  }
  return count;
}

detail::DeviceCaps read_device_caps(int ordinal) {
  detail::DeviceCaps caps;
  if (ordinal < 0 || ordinal >= visible_device_count()) return caps;
  int major = 0, minor = 0, sms = 0, smem = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ordinal) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, ordinal) !=
          cudaSuccess) {
    (void)cudaGetLastError();
    return caps;
  }
  caps.present = true;
  caps.compute_capability = major * 10 + minor;
  caps.sm_count = sms;
  caps.shared_memory_per_block_optin = smem;
  return caps;
}

Status can_run_sm80(const PlanRequest& request, const detail::DeviceCaps& caps) {
  M3SA_RETURN_IF_ERROR(detail::check_config_limits(request));
  if (!caps.present)
    return Status::unsupported(
        detail::concat("device_ordinal ", request.device_ordinal),
        visible_device_count() == 0
            ? std::string("no CUDA device is visible to this process")
            : detail::concat("not a visible CUDA device (", visible_device_count(), " visible)"));
  if (caps.compute_capability < 80)
    return Status::unsupported(detail::concat("compute capability ", caps.compute_capability / 10,
                                              ".", caps.compute_capability % 10),
                               "the kernels need 8.0 or newer (mma.sync, cp.async)");
  if (request.config.reduce_heads)
    return Status::unsupported("config.reduce_heads", "the CUDA kernels select per head");
  return {};
}

Status can_run_sm90a(const PlanRequest& request, const detail::DeviceCaps& caps,
                     bool has_sm90a_code, const char* kernels) {
  M3SA_RETURN_IF_ERROR(can_run_sm80(request, caps));
  if (caps.compute_capability != 90)
    return Status::unsupported(detail::concat("compute capability ", caps.compute_capability / 10,
                                              ".", caps.compute_capability % 10),
                               detail::concat(kernels, " run on 9.0 (sm_90a) only"));
  if (!has_sm90a_code)
    return Status::unsupported("the library's CUDA code",
                               "built with sm_90a in CMAKE_CUDA_ARCHITECTURES");
  return {};
}

ControlArea take_control_area(detail::WorkspaceCarver& carver, int64_t arrival_counters) {
  ControlArea c;
  c.control = carver.take<int32_t>(kArrivalsOffset + arrival_counters);
  c.error_flags = c.control ? c.control + kFlagOffset : nullptr;
  c.arrivals = c.control ? c.control + kArrivalsOffset : nullptr;
  c.bytes = (kArrivalsOffset + arrival_counters) * int64_t{sizeof(int32_t)};
  return c;
}

// Zero flag and counters, then the preparation mark read_control_errors checks.
Status initialise_control_area(const ControlArea& c, void* stream) {
  M3SA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(c.control, 0, c.bytes, as_stream(stream)));
  M3SA_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(c.control, kPreparedByte, kFlagOffset * sizeof(int32_t), as_stream(stream)));
  return {};
}

Status prepare_control_area(const OpPlan&, Workspace workspace, void* stream) {
  detail::WorkspaceCarver carver(workspace.data);
  return initialise_control_area(take_control_area(carver, 0), stream);
}

Status read_control_errors(const OpPlan&, Workspace workspace, void* stream, int32_t* flags) {
  detail::WorkspaceCarver carver(workspace.data);
  const ControlArea c = take_control_area(carver, 0);
  int32_t head[kFlagOffset + 1] = {};
  M3SA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(head, c.control, sizeof head, cudaMemcpyDeviceToHost, as_stream(stream)));
  M3SA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(c.error_flags, 0, sizeof(int32_t), as_stream(stream)));
  M3SA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(as_stream(stream)));
  int32_t prepared;
  std::memset(&prepared, kPreparedByte, sizeof prepared);
  if (head[0] != prepared || head[1] != prepared)
    return Status::invalid_argument("workspace", "one prepared by m3sa::prepare_workspace",
                                    "no preparation mark (its error flag and counters are not "
                                    "initialised; runs on it are undefined)");
  *flags = head[kFlagOffset];
  return {};
}

} // namespace m3sa::cuda
