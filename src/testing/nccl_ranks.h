#pragma once
// Multi-GPU NCCL plumbing shared by the context-parallel test and `m3sa bench` (CUDA builds with
// nccl.h; NCCL itself through the library's one loader, cuda::nccl_library()).
#include <functional>
#include <vector>

#include "cuda/nccl_exchange.h"

namespace m3sa::testing {

// One thread per rank, all at once (NCCL initialises a communicator only with every rank in):
// rank r selects device r, joins a communicator of `ranks` (one unique id), runs
// `body(rank, comm)` and destroys the communicator. The ranks' Statuses in rank order; a rank
// that could not join has an error naming the NCCL call.
std::vector<Status> run_on_ranks(int ranks,
                                 const std::function<Status(int rank, ncclComm_t comm)>& body);

} // namespace m3sa::testing
