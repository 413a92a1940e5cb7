#pragma once
// Host helpers of the CUDA launchers: CUDA errors as Status values (cuda/cuda_status.h, the one
// check), and streams as cudaStream_t.
#include <cuda_runtime.h>

#include "cuda/cuda_status.h"

namespace m3sa::cuda {

inline cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

} // namespace m3sa::cuda
