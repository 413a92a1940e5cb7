#pragma once
// The context-parallel exchange: an NCCL all-gather of 64-bit candidate keys. NCCL is loaded at
// run time (libnccl.so.2) so that binaries start without it; where m3sa was configured without
// NCCL headers the exchange is compiled out and reports unsupported.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "m3sa/status.h"

namespace m3sa::cuda {

// recv[rank * count + i] = send of `rank`, i < count, for every rank of `comm` (an ncclComm_t).
Status all_gather_u64(const uint64_t* send, uint64_t* recv, size_t count, void* comm,
                      cudaStream_t stream);

} // namespace m3sa::cuda
