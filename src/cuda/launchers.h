#pragma once
// Kernel launchers, one per translation unit. Each returns the launch's cudaError_t.
#include <cuda_runtime.h>

#include "cuda/attention_params.h"
#include "cuda/indexer_params.h"

namespace m3sa::cuda {

// With params.schedule (the SM90 scorer's, SM90 plans only) launched with programmatic dependent
// launch, as the scorer after it.
cudaError_t launch_schedule_tiles(const ScheduleParams& params, cudaStream_t stream);
cudaError_t launch_score_blocks_bf16(const ScoreBlocksParams& params, dim3 grid,
                                     cudaStream_t stream);
cudaError_t launch_score_blocks_fp8(const ScoreBlocksParams& params, dim3 grid,
                                    cudaStream_t stream);
// The SM90 scorer (persistent grid, one CTA per SM); *_has_sm90a_code: the binary holds its
// sm_90a machine code (a device running the portable PTX would get an empty kernel).
cudaError_t launch_score_blocks_sm90_bf16(const ScoreBlocksSm90Params& params, int grid,
                                          cudaStream_t stream);
cudaError_t launch_score_blocks_sm90_fp8(const ScoreBlocksSm90Params& params, int grid,
                                         cudaStream_t stream);
bool score_blocks_sm90_bf16_has_sm90a_code();
bool score_blocks_sm90_fp8_has_sm90a_code();
// e4m3 pages on e4m3 wgmma (inexact sums): index_topk's prefill rows, before
// launch_certify_selection.
cudaError_t launch_score_blocks_sm90_fp8_qgmma(const ScoreBlocksSm90Params& params, int grid,
                                               cudaStream_t stream);
bool score_blocks_sm90_fp8_qgmma_has_sm90a_code();
// The largest key norm of every causal block of the prefill requests (certify_selection.cuh),
// then, after the selection, each row's selection certified against the QGMMA scores' error
// bound and the blocks near its K-th score rescored exactly; both with programmatic dependent
// launch.
cudaError_t launch_key_norms(const KeyNormParams& params, int request_capacity,
                             cudaStream_t stream);
cudaError_t launch_certify_selection(const CertifySelectionParams& params, cudaStream_t stream);
// Decode scoring + selection; _k16 for at most 16 ranked slots (half the merge registers).
cudaError_t launch_decode_topk_bf16_k16(const DecodeTopkParams& params, dim3 grid,
                                        cudaStream_t stream);
cudaError_t launch_decode_topk_bf16_k32(const DecodeTopkParams& params, dim3 grid,
                                        cudaStream_t stream);
cudaError_t launch_decode_topk_fp8_k16(const DecodeTopkParams& params, dim3 grid,
                                       cudaStream_t stream);
cudaError_t launch_decode_topk_fp8_k32(const DecodeTopkParams& params, dim3 grid,
                                       cudaStream_t stream);
// Decode scoring + selection on Hopper (TMA-streamed index cache; requests of <= 8 rows), with
// their *_has_sm90a_code as the scorer's; _w8: the CTA of 8 warps (decode_sm90_warps).
cudaError_t launch_decode_topk_sm90_bf16_k16(const DecodeTopkSm90Params& params, dim3 grid,
                                             cudaStream_t stream);
cudaError_t launch_decode_topk_sm90_bf16_k32(const DecodeTopkSm90Params& params, dim3 grid,
                                             cudaStream_t stream);
cudaError_t launch_decode_topk_sm90_fp8_k16(const DecodeTopkSm90Params& params, dim3 grid,
                                            cudaStream_t stream);
cudaError_t launch_decode_topk_sm90_fp8_k32(const DecodeTopkSm90Params& params, dim3 grid,
                                            cudaStream_t stream);
cudaError_t launch_decode_topk_sm90_bf16_k16_w8(const DecodeTopkSm90Params& params, dim3 grid,
                                                cudaStream_t stream);
cudaError_t launch_decode_topk_sm90_bf16_k32_w8(const DecodeTopkSm90Params& params, dim3 grid,
                                                cudaStream_t stream);
cudaError_t launch_decode_topk_sm90_fp8_k16_w8(const DecodeTopkSm90Params& params, dim3 grid,
                                               cudaStream_t stream);
cudaError_t launch_decode_topk_sm90_fp8_k32_w8(const DecodeTopkSm90Params& params, dim3 grid,
                                               cudaStream_t stream);
bool decode_topk_sm90_bf16_k16_has_sm90a_code();
bool decode_topk_sm90_bf16_k32_has_sm90a_code();
bool decode_topk_sm90_fp8_k16_has_sm90a_code();
bool decode_topk_sm90_fp8_k32_has_sm90a_code();
bool decode_topk_sm90_bf16_k16_w8_has_sm90a_code();
bool decode_topk_sm90_bf16_k32_w8_has_sm90a_code();
bool decode_topk_sm90_fp8_k16_w8_has_sm90a_code();
bool decode_topk_sm90_fp8_k32_w8_has_sm90a_code();
// Their cluster instantiations (e4m3, 16 ranked slots at most): each tile's ranges (grid.y) one
// thread-block cluster, finishing in rank 0's shared memory; *_active_clusters: the clusters of
// that many ranges the device holds at once (plan time; 0 without sm_90a code).
cudaError_t launch_decode_topk_sm90_fp8_k16_cluster(const DecodeTopkSm90Params& params, dim3 grid,
                                                    cudaStream_t stream);
cudaError_t launch_decode_topk_sm90_fp8_k16_w8_cluster(const DecodeTopkSm90Params& params,
                                                       dim3 grid, cudaStream_t stream);
int decode_topk_sm90_fp8_k16_cluster_active_clusters(int cluster);
int decode_topk_sm90_fp8_k16_w8_cluster_active_clusters(int cluster);
cudaError_t launch_merge_candidates(const MergeCandidatesParams& params, cudaStream_t stream);
// overlap_prior: launched with programmatic dependent launch (SM90 plans, after the scorer).
cudaError_t launch_select_topk(const SelectTopkParams& params, cudaStream_t stream,
                               bool overlap_prior = false);
cudaError_t launch_norm_rope_insert(const NormRopeInsertParams& params, int token_capacity,
                                    int sm_count, cudaStream_t stream);
cudaError_t launch_insert_index_k(const InsertIndexKParams& params, int token_capacity,
                                  cudaStream_t stream);
// Sparse attention, decode rows: persistent grid, one token per CTA, selections split over CTAs
// (in clusters of `cluster` CTAs when params.split_merge is kMergeInCluster; grid a multiple of
// it);
// overlap_prior (SM90 only): programmatic dependent launch after the stream's previous kernel.
cudaError_t launch_sparse_attention_decode_bf16(const SparseAttentionParams& params, int grid,
                                                int cluster, bool overlap_prior,
                                                cudaStream_t stream);
cudaError_t launch_sparse_attention_decode_fp8(const SparseAttentionParams& params, int grid,
                                               int cluster, bool overlap_prior,
                                               cudaStream_t stream);
// Clusters of `cluster` (2..16) decode CTAs the current device holds at once (0: none).
int sparse_attention_decode_bf16_active_clusters(int cluster);
int sparse_attention_decode_fp8_active_clusters(int cluster);
// The Hopper decode kernel (TMA ring per warp): one CTA per (token, KV head, split), grid =
// decode tokens x KV heads x splits, no clusters, PDL; splits > 1 merge by the next kernel
// (launch_merge_decode_splits);
// *_has_sm90a_code: the binary holds its sm_90a code.
cudaError_t launch_sparse_attention_decode_sm90_bf16(const SparseAttentionSm90Params& params,
                                                     int grid, cudaStream_t stream);
cudaError_t launch_sparse_attention_decode_sm90_fp8(const SparseAttentionSm90Params& params,
                                                    int grid, cudaStream_t stream);
bool sparse_attention_decode_sm90_bf16_has_sm90a_code();
bool sparse_attention_decode_sm90_fp8_has_sm90a_code();
// The splits of the decode items launched just before (SplitMerge kMergeByNextKernel) merged
// from params.partials into the output rows and lse; overlap_prior: programmatic dependent launch.
cudaError_t launch_merge_decode_splits(const SparseAttentionParams& params, bool overlap_prior,
                                       cudaStream_t stream);
// Sparse attention, prefill rows, block-major: gather (KV head, token, slot) entries (and, with
// union_counts, list the page-union tiles: grid x 8 warps, a warp per tile; with key_tokens, mark
// each entry's token in its key's bitmap), sort them by (KV head, page), attend each page's member
// tokens, merge each token's partials.
cudaError_t launch_gather_selection_entries(const SparseAttentionParams& params, int grid,
                                            cudaStream_t stream);
// After the gather, before the page-union kernel: each listed tile's pages' V in fp16, once a pass
// (union_value_keys zeroed before it): the cells claimed a warp a tile (grid CTAs of
// kGatherThreads), then each claimed page converted by a CTA of its own.
cudaError_t launch_convert_union_values(const SparseAttentionParams& params, int grid,
                                        cudaStream_t stream);
cudaError_t selection_sort_temp_bytes(int entries, size_t* bytes); // CUB's, for any 32-bit keys
cudaError_t sort_selection_entries(const SparseAttentionParams& params, uint32_t* sorted_keys,
                                   uint32_t* sorted_values, int key_bits, void* temp,
                                   size_t temp_bytes, cudaStream_t stream);
// The counting sort after the gather (params.key_tokens and key_repeats filled by it): the live
// entries sorted by key, stably, into sorted_keys / sorted_values, their number in live_entries
// (two kernels; the scatter's grid given); counting_sort_fits(key_space, token_words).
cudaError_t sort_selection_entries_by_counting(const SparseAttentionParams& params,
                                               uint32_t* sorted_keys, uint32_t* sorted_values,
                                               int grid, cudaStream_t stream);
cudaError_t launch_attend_block_members_bf16(const SparseAttentionParams& params, int grid,
                                             cudaStream_t stream);
cudaError_t launch_attend_block_members_fp8(const SparseAttentionParams& params, int grid,
                                            cudaStream_t stream);
// The Hopper attend step (wgmma, TMA), persistent: grid <= one CTA per SM.
cudaError_t launch_attend_block_members_sm90_bf16(const SparseAttentionPrefillSm90Params& params,
                                                  int grid, cudaStream_t stream);
cudaError_t launch_attend_block_members_sm90_fp8(const SparseAttentionPrefillSm90Params& params,
                                                 int grid, cudaStream_t stream);
bool attend_block_members_sm90_bf16_has_sm90a_code();
bool attend_block_members_sm90_fp8_has_sm90a_code();
// The Hopper page-union step (tiles the gather listed: token-major, outputs written directly;
// bf16 caches), persistent: grid <= one CTA per SM.
cudaError_t launch_attend_page_unions_sm90_bf16(const SparseAttentionPrefillSm90Params& params,
                                                int grid, cudaStream_t stream);
bool attend_page_unions_sm90_bf16_has_sm90a_code();
// The merge of the prefill's partials: its groups an SM (the kernel's __launch_bounds__ keeps its
// registers within them, so that a grid of this many a SM is resident at once).
inline constexpr int kMergeTokenPartialsCtasPerSm = 9;
cudaError_t launch_merge_token_partials(const SparseAttentionParams& params, int grid,
                                        cudaStream_t stream);

} // namespace m3sa::cuda
