#pragma once
// What each backend can run, answered from the registry of implementations (m3sa/registry.h)
// that also drives make_plan and the tests.
#include "m3sa/config.h"
#include "m3sa/ops.h"
#include "m3sa/status.h"
#include "m3sa/types.h"

namespace m3sa {

// OK when one of `backend`'s implementations of `op` can run `config` and `cache_dtype` here
// (built, device present and capable); otherwise says which requirement each one misses. A
// cache_dtype other than bf16 / fp8_e4m3 is invalid_argument, as make_plan answers it.
Status supports(Backend backend, OpKind op, const MsaConfig& config,
                DType cache_dtype = DType::bf16);
// The same for every op of the MSA pipeline.
Status supports(Backend backend, const MsaConfig& config, DType cache_dtype = DType::bf16);

// CUDA devices visible to this process (0 where the CUDA backend is not built or no driver).
int cuda_device_count();
bool cuda_backend_built();

// cuda where supported, else cpu: for every op of the pipeline, or for one op.
Backend best_available_backend(const MsaConfig& config, DType cache_dtype = DType::bf16);
Backend best_available_backend(OpKind op, const MsaConfig& config, DType cache_dtype = DType::bf16);

} // namespace m3sa
