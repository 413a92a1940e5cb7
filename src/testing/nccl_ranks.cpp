#include "testing/nccl_ranks.h"

#include <cuda_runtime.h>

#include <thread>

#include "cuda/cuda_status.h"

namespace m3sa::testing {

std::vector<Status> run_on_ranks(int ranks,
                                 const std::function<Status(int rank, ncclComm_t comm)>& body) {
  const cuda::NcclLibrary& nccl = cuda::nccl_library();
  if (!nccl.loaded())
    return std::vector<Status>(ranks, Status::unsupported("NCCL", nccl.error));
  ncclUniqueId id;
  if (const ncclResult_t r = nccl.get_unique_id(&id); r != ncclSuccess)
    return std::vector<Status>(
        ranks, {StatusCode::cuda_error, detail::concat("ncclGetUniqueId: ", nccl.get_error_string(r))});
  std::vector<Status> results(ranks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank)
    threads.emplace_back([&, rank] {
      results[rank] = cuda::cuda_status(cudaSetDevice(rank), "cudaSetDevice");
      if (!results[rank].ok()) return;
      ncclComm_t comm;
      if (const ncclResult_t r = nccl.comm_init_rank(&comm, ranks, id, rank); r != ncclSuccess) {
        results[rank] = {StatusCode::cuda_error,
                         detail::concat("ncclCommInitRank: ", nccl.get_error_string(r))};
        return;
      }
      results[rank] = body(rank, comm);
      nccl.comm_destroy(comm);
    });
  for (std::thread& t : threads) t.join();
  return results;
}

} // namespace m3sa::testing
