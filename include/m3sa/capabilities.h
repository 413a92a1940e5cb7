#pragma once
// What each backend can run, answered from one table (src/common/supported_configs.h) that also
// drives dispatch and test enumeration.
#include "m3sa/config.h"
#include "m3sa/ops.h"
#include "m3sa/status.h"
#include "m3sa/types.h"

namespace m3sa {

// OK when `backend` is built, has a device where it needs one, and runs `op` with `config` and
// `cache_dtype`; otherwise says which requirement is missing.
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
