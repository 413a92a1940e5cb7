#pragma once
// TMA descriptors (CUtensorMap, 128 B opaque, kept as uint64_t[16] so that kernel parameter
// structs need no driver header) of the cache views the Hopper kernels stream. Encoded on the
// host at run time (no device access, no allocation: graph-capturable) through the runtime's
// driver entry point, so the library never links libcuda. Each returns false where TMA cannot
// address the view (base or strides not multiples of 16 bytes, a strided last dimension, more
// pages than a 32-bit coordinate holds, no driver entry point): the portable kernels take those.
#include <cstdint>

#include "m3sa/tensor_view.h"

namespace m3sa::cuda {

// Index-K cache [pages, 128, 128]: boxes of `box_tokens` (1..128) consecutive tokens of one page
// x 128 bytes (coordinates: element, token, page; a bf16 page's 128 bytes are dims 0-63 or
// 64-127), 128 B swizzle.
bool encode_index_k_map(const TensorView& cache, int box_tokens, uint64_t (&map)[16]);

// K or V cache [pages, 128, Hkv, 128] (any page, token and head strides, e.g. the K or V half
// of a combined [pages, Hkv, 128, 2 x 128] cache): boxes of `rows` consecutive tokens of one
// (page, KV head) x 128 bytes of dims (coordinates: dim, token, head, page), 128 B swizzle.
bool encode_kv_cache_map(const TensorView& cache, int rows, uint64_t (&map)[16]);

// Queries [T, Hq, 128] bf16 (any token and head strides): boxes of `rows` consecutive heads of
// one token x 64 dims (coordinates: dim, head, token), 128 B swizzle.
bool encode_query_map(const TensorView& q, int rows, uint64_t (&map)[16]);

// Index-Q [T, H, 128] bf16 (any token and head strides) for the SM90 scorer's row tiles (row =
// token x H + head): boxes of 64 rows (64 / H tokens x H heads) x 64 dims (coordinates: dim,
// head, token), 128 B swizzle. H a power of two up to 64; false otherwise.
bool encode_index_q_map(const TensorView& q, int heads, uint64_t (&map)[16]);

// The prefill's compact partials (attention_params.h kCompactPartialBytes each, `count` of them
// from `partials`): boxes of 16 rows x 64 16-bit values of one partial's O (coordinates: value,
// row, partial), 128 B swizzle, for TMA stores.
bool encode_compact_partials_map(void* partials, int64_t count, uint64_t (&map)[16]);

} // namespace m3sa::cuda
