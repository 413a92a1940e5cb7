#include "cuda/nccl_exchange.h"

#include "common/check.h"

#ifdef M3SA_HAVE_NCCL
#include <dlfcn.h>

#include <type_traits>

namespace m3sa::cuda {

const NcclLibrary& nccl_library() {
  static const NcclLibrary loaded = [] {
    NcclLibrary n;
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) lib = dlopen("libnccl.so", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
      const char* why = dlerror();
      n.error = detail::concat("libnccl.so.2 not loadable: ", why ? why : "dlopen failed");
      return n;
    }
    const auto load = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn && n.error.empty()) n.error = detail::concat("libnccl.so.2 lacks ", name);
    };
    load(n.get_unique_id, "ncclGetUniqueId");
    load(n.comm_init_rank, "ncclCommInitRank");
    load(n.comm_destroy, "ncclCommDestroy");
    load(n.all_gather, "ncclAllGather");
    load(n.get_error_string, "ncclGetErrorString");
    if (!n.error.empty()) { // all or nothing
      NcclLibrary none;
      none.error = n.error;
      return none;
    }
    return n;
  }();
  return loaded;
}

Status all_gather_u64(const uint64_t* send, uint64_t* recv, size_t count, void* comm,
                      cudaStream_t stream) {
  if (comm == nullptr) return Status::invalid_argument("nccl_comm", "an ncclComm_t", "nullptr");
  const NcclLibrary& n = nccl_library();
  if (!n.loaded())
    return Status::unsupported("NCCL", "libnccl.so.2 could not be loaded (set LD_LIBRARY_PATH)");
  const ncclResult_t r =
      n.all_gather(send, recv, count, ncclUint64, static_cast<ncclComm_t>(comm), stream);
  if (r != ncclSuccess)
    return {StatusCode::cuda_error, detail::concat("ncclAllGather: ", n.get_error_string(r))};
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
