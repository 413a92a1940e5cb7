// TMA descriptors of the cache views (tensor_maps.h).
#include "cuda/tensor_maps.h"

#include "cuda/attention_params.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

namespace m3sa::cuda {
namespace {

// cuTensorMapEncodeTiled through the runtime's driver entry point, or null when the driver has
// none.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encoder;
}

bool addressable(int64_t bytes) {
  return bytes > 0 && bytes % 16 == 0 && bytes < (int64_t{1} << 40);
}

// A map over `rank` dims (innermost first: 128 elements of 1 or 2 bytes, contiguous; the outermost
// the pages, tokens or partials, which the kernels pass as 32-bit coordinates) of the data at
// `base`, with the outer dims' byte strides, boxes of `box` elements, 128 B swizzle.
bool encode_tiled(const void* base, bool one_byte, int rank, const cuuint64_t* dims,
                  const int64_t* stride_bytes, const cuuint32_t* box, uint64_t (&map)[16]) {
  static_assert(sizeof(CUtensorMap) == sizeof(map));
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr || reinterpret_cast<uintptr_t>(base) % 16 != 0 ||
      dims[rank - 1] > (cuuint64_t{1} << 31))
    return false;
  cuuint64_t strides[4];
  for (int i = 0; i + 1 < rank; ++i) {
    if (!addressable(stride_bytes[i])) return false;
    strides[i] = static_cast<cuuint64_t>(stride_bytes[i]);
  }
  const cuuint32_t unit_strides[5] = {1, 1, 1, 1, 1};
  return encode(reinterpret_cast<CUtensorMap*>(map),
                one_byte ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                static_cast<cuuint32_t>(rank), const_cast<void*>(base), dims, strides, box,
                unit_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}
bool encode_tiled(const TensorView& view, int rank, const cuuint64_t* dims,
                  const int64_t* stride_bytes, const cuuint32_t* box, uint64_t (&map)[16]) {
  return encode_tiled(view.data, view.dtype == DType::fp8_e4m3, rank, dims, stride_bytes, box, map);
}

} // namespace

bool encode_index_k_map(const TensorView& cache, int box_tokens, uint64_t (&map)[16]) {
  const auto element = static_cast<int64_t>(dtype_size(cache.dtype));
  if (cache.rank != 3 || cache.strides[2] != 1 || box_tokens < 1 || box_tokens > 128) return false;
  const cuuint64_t dims[3] = {128, 128, static_cast<cuuint64_t>(cache.shape[0])};
  const int64_t strides[2] = {cache.strides[1] * element, cache.strides[0] * element};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(128 / element),
                             static_cast<cuuint32_t>(box_tokens), 1};
  return encode_tiled(cache, 3, dims, strides, box, map);
}

bool encode_kv_cache_map(const TensorView& cache, int rows, uint64_t (&map)[16]) {
  const auto element = static_cast<int64_t>(dtype_size(cache.dtype));
  if (cache.rank != 4 || cache.strides[3] != 1 || rows < 1 || rows > 128) return false;
  const cuuint64_t dims[4] = {128, 128, static_cast<cuuint64_t>(cache.shape[2]),
                              static_cast<cuuint64_t>(cache.shape[0])};
  const int64_t strides[3] = {cache.strides[1] * element, cache.strides[2] * element,
                              cache.strides[0] * element};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(128 / element), static_cast<cuuint32_t>(rows),
                             1, 1};
  return encode_tiled(cache, 4, dims, strides, box, map);
}

bool encode_query_map(const TensorView& q, int rows, uint64_t (&map)[16]) {
  if (q.rank != 3 || q.dtype != DType::bf16 || q.strides[2] != 1 || q.shape[2] != 128 || rows < 1 ||
      rows > 256)
    return false;
  const cuuint64_t dims[3] = {128, static_cast<cuuint64_t>(q.shape[1]),
                              static_cast<cuuint64_t>(q.shape[0])};
  const int64_t strides[2] = {q.strides[1] * 2, q.strides[0] * 2};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(rows), 1};
  return encode_tiled(q, 3, dims, strides, box, map);
}

bool encode_index_q_map(const TensorView& q, int heads, uint64_t (&map)[16]) {
  if (q.rank != 3 || q.dtype != DType::bf16 || q.strides[2] != 1 || q.shape[2] != 128 ||
      heads < 1 || heads > 64 || (heads & (heads - 1)) != 0 || q.shape[1] != heads)
    return false;
  const cuuint64_t dims[3] = {128, static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(q.shape[0])};
  const int64_t strides[2] = {q.strides[1] * 2, q.strides[0] * 2};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(heads),
                             static_cast<cuuint32_t>(64 / heads)};
  return encode_tiled(q, 3, dims, strides, box, map);
}

bool encode_compact_partials_map(void* partials, int64_t count, uint64_t (&map)[16]) {
  if (count < 1) return false;
  // O of each partial: kAttentionRows rows x 128 16-bit values after the header (m, l, a).
  constexpr int kHeaderBytes = 3 * kAttentionRows * 4;
  static_assert(kCompactPartialBytes == kHeaderBytes + kAttentionRows * 128 * 2);
  const cuuint64_t dims[3] = {128, kAttentionRows, static_cast<cuuint64_t>(count)};
  const int64_t strides[2] = {128 * 2, kCompactPartialBytes};
  const cuuint32_t box[3] = {64, kAttentionRows, 1};
  return encode_tiled(static_cast<unsigned char*>(partials) + kHeaderBytes, false, 3, dims, strides,
                      box, map);
}

} // namespace m3sa::cuda
