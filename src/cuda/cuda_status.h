#pragma once
// The one CUDA error check: a failed runtime call as a Status naming the call, the error's name
// and its description. M3SA_CUDA_RETURN_IF_ERROR returns it from the enclosing Status function;
// the library (backend.cu) and the CLI use it, the GPU tests wrap cuda_status in an assertion.
#include <cuda_runtime.h>

#include "common/check.h"

namespace m3sa::cuda {

inline Status cuda_status(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return {};
  return {StatusCode::cuda_error,
          detail::concat(what, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error))};
}

} // namespace m3sa::cuda

#define M3SA_CUDA_RETURN_IF_ERROR(expr)                                                            \
  M3SA_RETURN_IF_ERROR(::m3sa::cuda::cuda_status((expr), #expr))
