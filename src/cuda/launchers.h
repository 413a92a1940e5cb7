#pragma once
// Kernel launchers, one per translation unit. Each returns the launch's cudaError_t.
#include <cuda_runtime.h>

#include "cuda/indexer_params.h"

namespace m3sa::cuda {

cudaError_t launch_schedule_tiles(const ScheduleParams& params, cudaStream_t stream);
cudaError_t launch_score_blocks_bf16(const ScoreBlocksParams& params, dim3 grid,
                                     cudaStream_t stream);
cudaError_t launch_score_blocks_fp8(const ScoreBlocksParams& params, dim3 grid,
                                    cudaStream_t stream);
// Decode scoring + selection; _k16 for at most 16 ranked slots (half the merge registers).
cudaError_t launch_decode_topk_bf16_k16(const DecodeTopkParams& params, dim3 grid,
                                        cudaStream_t stream);
cudaError_t launch_decode_topk_bf16_k32(const DecodeTopkParams& params, dim3 grid,
                                        cudaStream_t stream);
cudaError_t launch_decode_topk_fp8_k16(const DecodeTopkParams& params, dim3 grid,
                                       cudaStream_t stream);
cudaError_t launch_decode_topk_fp8_k32(const DecodeTopkParams& params, dim3 grid,
                                       cudaStream_t stream);
cudaError_t launch_merge_candidates(const MergeCandidatesParams& params, cudaStream_t stream);
cudaError_t launch_select_topk(const SelectTopkParams& params, cudaStream_t stream);
cudaError_t launch_norm_rope_insert(const NormRopeInsertParams& params, int token_capacity,
                                    int sm_count, cudaStream_t stream);
cudaError_t launch_insert_index_k(const InsertIndexKParams& params, int token_capacity,
                                  cudaStream_t stream);

} // namespace m3sa::cuda
