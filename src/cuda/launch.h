#pragma once
// Host helpers of the CUDA launchers: CUDA errors as Status values, and streams as cudaStream_t.
#include <cuda_runtime.h>

#include "common/check.h"
#include "m3sa/status.h"

namespace m3sa::cuda {

inline Status cuda_status(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return {};
  return {StatusCode::cuda_error,
          detail::concat(what, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error))};
}

inline cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

} // namespace m3sa::cuda

#define M3SA_CUDA_RETURN_IF_ERROR(expr)                                                            \
  M3SA_RETURN_IF_ERROR(::m3sa::cuda::cuda_status((expr), #expr))
