#pragma once
// The context-parallel exchange: an NCCL all-gather of 64-bit candidate keys. NCCL is loaded at
// run time (libnccl.so.2) so that binaries start without it; where m3sa was configured without
// NCCL headers the exchange is compiled out and reports unsupported.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "m3sa/status.h"

#ifdef M3SA_HAVE_NCCL // nccl.h found at configure time: the library, the GPU tests and the bench
#include <nccl.h>

#include <string>
#endif

namespace m3sa::cuda {

// recv[rank * count + i] = send of `rank`, i < count, for every rank of `comm` (an ncclComm_t).
Status all_gather_u64(const uint64_t* send, uint64_t* recv, size_t count, void* comm,
                      cudaStream_t stream);

#ifdef M3SA_HAVE_NCCL
// The one NCCL loader (the exchange above, the multi-GPU test and `m3sa bench` use it): the
// entry points m3sa needs, typed by nccl.h, from libnccl.so.2 (or libnccl.so) opened once with
// RTLD_GLOBAL; all null, with `error` saying why, where the library cannot be loaded.
struct NcclLibrary {
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclGetErrorString) get_error_string = nullptr;
  std::string error; // empty when every entry point was found
  bool loaded() const { return error.empty(); }
};

// Loaded on first use (thread-safe static initialisation).
const NcclLibrary& nccl_library();
#endif

} // namespace m3sa::cuda
