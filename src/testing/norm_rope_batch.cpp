#include "testing/norm_rope_batch.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <numeric>
#include <utility>
#include <vector>

#include "common/check.h"

namespace m3sa::testing {
namespace {

void fill_normal(const HostTensor& t, Rng& rng, float scale) {
  const int64_t n = t.view().numel();
  for (int64_t i = 0; i < n; ++i) store(t.view().dtype, t.view().data, i, rng.normal() * scale);
}

// Distinct slots of a paged cache for every token, -1 for every `padding_every`-th token.
void fill_slots(const HostTensor& slots, int pages, int padding_every, Rng& rng) {
  std::vector<int64_t> all(static_cast<size_t>(pages) * kBlockTokens);
  std::iota(all.begin(), all.end(), 0);
  for (size_t i = all.size() - 1; i > 0; --i)
    std::swap(all[i], all[static_cast<size_t>(rng.uniform_int(0, static_cast<int>(i)))]);
  const int64_t tokens = slots.view().shape[0];
  for (int64_t t = 0; t < tokens; ++t)
    slots.data<int64_t>()[t] =
        padding_every > 0 && t % padding_every == padding_every - 1 ? -1 : all[t % all.size()];
}

int64_t ordered(DType dtype, const void* base, int64_t i) {
  if (dtype == DType::bf16) {
    const uint16_t bits = static_cast<const uint16_t*>(base)[i];
    return (bits & 0x8000) ? -int64_t{bits & 0x7fff} : int64_t{bits & 0x7fff};
  }
  const uint8_t bits = static_cast<const uint8_t*>(base)[i];
  return (bits & 0x80) ? -int64_t{bits & 0x7f} : int64_t{bits & 0x7f};
}

} // namespace

NormRopeBatch::NormRopeBatch(const NormRopeSpec& s) : spec_(s) {
  Rng rng(s.seed);
  const int64_t T = s.tokens;
  q.reset(DType::bf16, {T, s.q_heads, kHeadDim});
  k.reset(DType::bf16, {T, s.kv_heads, kHeadDim});
  v.reset(DType::bf16, {T, s.kv_heads, kHeadDim});
  index_q.reset(DType::bf16, {T, s.index_heads, kHeadDim});
  index_k.reset(DType::bf16, {T, kHeadDim});
  positions.reset(DType::i64, {T});
  slot_mapping.reset(DType::i64, {T});
  index_slot_mapping.reset(DType::i64, {T});
  q_out.reset(DType::bf16, {T, s.q_heads, kHeadDim});
  k_cache.reset(s.kv_dtype, {s.kv_pages, kBlockTokens, s.kv_heads, kHeadDim});
  v_cache.reset(s.kv_dtype, {s.kv_pages, kBlockTokens, s.kv_heads, kHeadDim});
  index_q_out.reset(s.index_dtype, {T, s.index_heads, kHeadDim});
  index_k_cache.reset(s.index_dtype, {s.index_pages, kBlockTokens, kHeadDim});
  if (s.table_rows > 0) cos_sin_cache.reset(s.table_dtype, {s.table_rows, kRotaryDim});
  status_ = check_allocated({&q, &k, &v, &index_q, &index_k, &positions, &slot_mapping,
                             &index_slot_mapping, &q_out, &k_cache, &v_cache, &index_q_out,
                             &index_k_cache, &cos_sin_cache},
                            "norm_rope_insert batch");
  if (!status_.ok()) return;
  // Projection outputs of a few units, gains near zero (Gemma stores w with the +1 left out).
  for (const HostTensor* t : {&q, &k, &v, &index_q, &index_k}) fill_normal(*t, rng, 3.f);
  for (HostTensor& w : weights) {
    w.reset(s.weight_dtype, {kHeadDim});
    fill_normal(w, rng, 0.2f);
  }
  const int64_t limit =
      s.table_rows > 0 ? std::min<int64_t>(s.table_rows, s.max_position) : s.max_position;
  for (int64_t t = 0; t < T; ++t) // both ends of the range, then uniform
    positions.data<int64_t>()[t] =
        t == 0   ? 0
        : t == 1 ? limit - 1
                 : static_cast<int64_t>(rng.uniform() * static_cast<double>(limit));
  if (s.table_rows > 0) {
    for (int64_t p = 0; p < s.table_rows; ++p)
      for (int i = 0; i < kRotaryDim / 2; ++i) {
        const double angle = static_cast<double>(p) * std::pow(1e4, -i / 32.0);
        store(s.table_dtype, cos_sin_cache.view().data, p * kRotaryDim + i,
              static_cast<float>(std::cos(angle)));
        store(s.table_dtype, cos_sin_cache.view().data, p * kRotaryDim + 32 + i,
              static_cast<float>(std::sin(angle)));
      }
  }
  fill_slots(slot_mapping, s.kv_pages, s.padding_every, rng);
  fill_slots(index_slot_mapping, s.index_pages, s.padding_every, rng);
  poison_outputs();
}

NormRopeInsertArgs NormRopeBatch::args(bool in_place) const {
  NormRopeInsertArgs a;
  a.q = q.view(), a.k = k.view(), a.v = v.view(), a.index_q = index_q.view();
  a.index_k = index_k.view(), a.positions = positions.view();
  a.q_norm_weight = weights[0].view(), a.k_norm_weight = weights[1].view();
  a.index_q_norm_weight = weights[2].view(), a.index_k_norm_weight = weights[3].view();
  a.cos_sin_cache = cos_sin_cache.view();
  a.slot_mapping = slot_mapping.view();
  a.index_slot_mapping = spec_.shared_slots ? slot_mapping.view() : index_slot_mapping.view();
  a.q_out = in_place ? q.view() : q_out.view();
  a.k_cache = k_cache.view(), a.v_cache = v_cache.view();
  a.k_scale = spec_.k_scale, a.v_scale = spec_.v_scale;
  a.index_q_out = in_place ? index_q.view() : index_q_out.view();
  a.index_k_cache = index_k_cache.view();
  return a;
}

void NormRopeBatch::poison_outputs() const {
  for (const HostTensor* t : {&q_out, &k_cache, &v_cache, &index_q_out, &index_k_cache})
    t->fill_bytes(0x5a);
}

Status run_norm_rope_insert(const MsaConfig& config, const NormRopeBatch& batch, Backend backend,
                            int num_threads, bool in_place) {
  return run_norm_rope_insert(config, batch, batch.args(in_place), backend, num_threads);
}

Status run_norm_rope_insert(const MsaConfig& config, const NormRopeBatch& batch,
                            const NormRopeInsertArgs& args, Backend backend, int num_threads) {
  PlanRequest request;
  request.op = OpKind::norm_rope_insert;
  request.backend = backend;
  request.config = config;
  request.config.num_index_heads = batch.spec().index_heads;
  request.capacities = {1, batch.spec().tokens, 1};
  request.cache_dtype = batch.spec().index_dtype;
  request.num_threads = num_threads;
  OpPlan plan;
  M3SA_RETURN_IF_ERROR(make_plan(request, &plan));
  HostTensor workspace(DType::i32, {static_cast<int64_t>(plan.workspace_bytes / 4 + 1)});
  return norm_rope_insert(plan, args, {workspace.view().data, plan.workspace_bytes},
                          {num_threads, nullptr});
}

UlpComparison compare_ulps(const TensorView& want, const TensorView& got, double abs_tolerance) {
  UlpComparison c;
  c.elements = want.numel();
  for (int64_t i = 0; i < c.elements; ++i) {
    const int64_t d = std::abs(ordered(want.dtype, want.data, i) - ordered(got.dtype, got.data, i));
    c.differing += d != 0;
    c.max_ulps = std::max(c.max_ulps, d);
    if (d > 1) {
      const double gap =
          std::fabs(double{load(want.dtype, want.data, i)} - load(got.dtype, got.data, i));
      (gap <= abs_tolerance ? c.absorbed : c.outside) += 1;
    }
  }
  return c;
}

std::string UlpComparison::to_string() const {
  return detail::concat(differing, " of ", elements, " elements differ, by at most ", max_ulps,
                        " ulp; beyond 1 ulp: ", absorbed, " within the absolute tolerance, ",
                        outside, " outside");
}

namespace {

// Rows `rows[i]` (of `row_elems` elements) of `src`, packed.
HostTensor pack_rows(const HostTensor& src, int64_t row_elems, const std::vector<int64_t>& rows) {
  HostTensor out(src.view().dtype, {static_cast<int64_t>(rows.size()), row_elems});
  const size_t row_bytes = static_cast<size_t>(row_elems) * dtype_size(src.view().dtype);
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(out.data<char>() + i * row_bytes, src.data<char>() + rows[i] * row_bytes,
                row_bytes);
  return out;
}

} // namespace

NormRopeCheck check_norm_rope_sample(const MsaConfig& config, const NormRopeBatch& step,
                                     const std::vector<int64_t>& sample, const HostTensor& q_out,
                                     const HostTensor& index_q_out, const HostTensor& k_cache,
                                     const HostTensor& v_cache, const HostTensor& index_k_cache) {
  NormRopeCheck check;
  const NormRopeSpec& s = step.spec();
  const int64_t count = static_cast<int64_t>(sample.size());
  NormRopeSpec compact = s;
  compact.tokens = static_cast<int>(count);
  compact.kv_pages = compact.index_pages =
      static_cast<int>((count + kBlockTokens - 1) / kBlockTokens);
  compact.padding_every = 0;
  compact.shared_slots = false;
  const NormRopeBatch ref(compact);
  std::vector<int64_t> kv_slots, index_slots;
  for (int64_t t : sample) {
    kv_slots.push_back(step.slot_mapping.data<int64_t>()[t]);
    index_slots.push_back(step.index_slot_mapping.data<int64_t>()[t]);
  }
  // The sampled tokens' inputs, weights and table; slot i for the i-th.
  const std::pair<const HostTensor*, int64_t> inputs[] = {
      {&step.q, int64_t{s.q_heads} * kHeadDim},
      {&step.k, int64_t{s.kv_heads} * kHeadDim},
      {&step.v, int64_t{s.kv_heads} * kHeadDim},
      {&step.index_q, int64_t{s.index_heads} * kHeadDim},
      {&step.index_k, kHeadDim},
      {&step.positions, 1}};
  const HostTensor* targets[] = {&ref.q,       &ref.k,       &ref.v,
                                 &ref.index_q, &ref.index_k, &ref.positions};
  for (size_t i = 0; i < std::size(inputs); ++i) {
    const HostTensor rows = pack_rows(*inputs[i].first, inputs[i].second, sample);
    std::memcpy(targets[i]->view().data, rows.view().data, rows.bytes());
  }
  for (int i = 0; i < 4; ++i)
    std::memcpy(ref.weights[i].view().data, step.weights[i].view().data, step.weights[i].bytes());
  if (s.table_rows > 0)
    std::memcpy(ref.cos_sin_cache.view().data, step.cos_sin_cache.view().data,
                step.cos_sin_cache.bytes());
  for (int64_t i = 0; i < count; ++i)
    ref.slot_mapping.data<int64_t>()[i] = ref.index_slot_mapping.data<int64_t>()[i] = i;
  check.status = run_norm_rope_insert(config, ref, Backend::reference);
  if (!check.status.ok()) return check;

  std::vector<int64_t> first_rows(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) first_rows[i] = i;
  const int64_t kv_row = int64_t{s.kv_heads} * kHeadDim;
  const std::pair<HostTensor, HostTensor> pairs[] = {
      {pack_rows(ref.q_out, int64_t{s.q_heads} * kHeadDim, first_rows),
       pack_rows(q_out, int64_t{s.q_heads} * kHeadDim, sample)},
      {pack_rows(ref.index_q_out, int64_t{s.index_heads} * kHeadDim, first_rows),
       pack_rows(index_q_out, int64_t{s.index_heads} * kHeadDim, sample)},
      {pack_rows(ref.k_cache, kv_row, first_rows), pack_rows(k_cache, kv_row, kv_slots)},
      {pack_rows(ref.v_cache, kv_row, first_rows), pack_rows(v_cache, kv_row, kv_slots)},
      {pack_rows(ref.index_k_cache, kHeadDim, first_rows),
       pack_rows(index_k_cache, kHeadDim, index_slots)}};
  for (int i = 0; i < 5; ++i)
    check.outputs[i] = compare_ulps(pairs[i].first.view(), pairs[i].second.view(), 1.0 / 4096);
  return check;
}

bool NormRopeCheck::ok() const {
  if (!status.ok()) return false;
  for (const UlpComparison& c : outputs)
    if (c.outside != 0) return false;
  return true;
}

std::string NormRopeCheck::to_string() const {
  if (!status.ok()) return status.to_string();
  int64_t elements = 0, differing = 0, max_ulps = 0, outside = 0;
  for (const UlpComparison& c : outputs) {
    elements += c.elements, differing += c.differing, outside += c.outside;
    max_ulps = std::max(max_ulps, c.max_ulps);
  }
  return detail::concat(elements, " values vs reference: ", differing, " differ (max ", max_ulps,
                        " ulp), ", outside, " beyond 1 ulp and 2^-12");
}

} // namespace m3sa::testing
