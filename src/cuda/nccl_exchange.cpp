#include "cuda/nccl_exchange.h"

#include "common/check.h"

#ifdef M3SA_HAVE_NCCL
#include <dlfcn.h>
#include <nccl.h>

namespace m3sa::cuda {
namespace {

struct Nccl {
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
};

// Loaded once (thread-safe static initialisation); null members where the library is absent.
const Nccl& nccl() {
  static const Nccl loaded = [] {
    Nccl n;
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) lib = dlopen("libnccl.so", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) return n;
    n.all_gather = reinterpret_cast<decltype(&ncclAllGather)>(dlsym(lib, "ncclAllGather"));
    n.error_string =
        reinterpret_cast<decltype(&ncclGetErrorString)>(dlsym(lib, "ncclGetErrorString"));
    return n;
  }();
  return loaded;
}

} // namespace

Status all_gather_u64(const uint64_t* send, uint64_t* recv, size_t count, void* comm,
                      cudaStream_t stream) {
  if (comm == nullptr) return Status::invalid_argument("nccl_comm", "an ncclComm_t", "nullptr");
  const Nccl& n = nccl();
  if (!n.all_gather || !n.error_string)
    return Status::unsupported("NCCL", "libnccl.so.2 could not be loaded (set LD_LIBRARY_PATH)");
  const ncclResult_t r =
      n.all_gather(send, recv, count, ncclUint64, static_cast<ncclComm_t>(comm), stream);
  if (r != ncclSuccess)
    return {StatusCode::cuda_error, detail::concat("ncclAllGather: ", n.error_string(r))};
  return {};
}

} // namespace m3sa::cuda

#else

namespace m3sa::cuda {

Status all_gather_u64(const uint64_t*, uint64_t*, size_t, void*, cudaStream_t) {
  return Status::unsupported("NCCL", "m3sa was configured without NCCL headers (nccl.h); "
                                     "exchange the candidates yourself between "
                                     "score_shard_candidates and merge_shard_candidates");
}

} // namespace m3sa::cuda

#endif
