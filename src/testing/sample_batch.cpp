#include "testing/sample_batch.h"

#include <cstring>
#include <utility>

namespace m3sa::testing {

HostTensor gather_tokens(const HostTensor& src, const std::vector<int64_t>& tokens, int token_dim) {
  const TensorView v = src.view();
  HostTensor dst;
  if (!v.present() || v.numel() == 0) return dst;
  const int64_t s = static_cast<int64_t>(tokens.size());
  if (v.rank == 2)
    dst.reset(v.dtype, {s, v.shape[1]});
  else if (token_dim == 0)
    dst.reset(v.dtype, {s, v.shape[1], v.shape[2]});
  else
    dst.reset(v.dtype, {v.shape[0], s, v.shape[2]});
  const size_t elem = dtype_size(v.dtype);
  const int64_t outer = token_dim == 0 ? 1 : v.shape[0];
  const int64_t inner = token_dim == 0 ? v.numel() / v.shape[0] : v.shape[2];
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < s; ++i)
      std::memcpy(dst.data<char>() + ((o * s + i) * inner) * elem,
                  static_cast<const char*>(v.data) +
                      ((o * v.shape[token_dim] + tokens[i]) * inner) * elem,
                  inner * elem);
  return dst;
}

SampleBatch make_sample(const SyntheticBatch& sb, std::vector<int64_t> tokens) {
  SampleBatch s;
  s.tokens = std::move(tokens);
  const int64_t n = static_cast<int64_t>(s.tokens.size());
  s.cu_q_lens.reset(DType::i32, {n + 1});
  s.seq_lens.reset(DType::i32, {n});
  s.block_table.reset(DType::i32, {n, sb.width()});
  s.kv_block_table.reset(DType::i32, {n, sb.width()});
  for (int64_t i = 0; i <= n; ++i) s.cu_q_lens.data<int32_t>()[i] = static_cast<int32_t>(i);
  for (int64_t i = 0; i < n; ++i) {
    const int r = sb.request_of(s.tokens[i]);
    // A lone token at position p sees exactly what it saw in the batch when seq_len = p + 1.
    s.seq_lens.data<int32_t>()[i] = static_cast<int32_t>(sb.position(s.tokens[i]) + 1);
    std::memcpy(s.block_table.data<int32_t>() + i * sb.width(),
                sb.block_table.data<int32_t>() + r * sb.width(), sb.width() * 4);
    std::memcpy(s.kv_block_table.data<int32_t>() + i * sb.width(),
                sb.kv_block_table.data<int32_t>() + r * sb.width(), sb.width() * 4);
  }
  s.index_q = gather_tokens(sb.index_q, s.tokens, 0);
  s.q = gather_tokens(sb.q, s.tokens, 0);
  return s;
}

} // namespace m3sa::testing
