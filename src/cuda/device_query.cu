// The CUDA runtime's view of the machine. Any error (no driver, as on the CPU-only build machine,
// or no device) counts as zero devices: GPU tests then skip and dispatch falls back to the CPU.
#include <cuda_runtime.h>

namespace m3sa::cuda {

int visible_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  return count;
}

}  // namespace m3sa::cuda
