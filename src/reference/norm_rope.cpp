// Reference norm_rope_insert (docs/contract.md §7): every row in
// double, rounded once to its output dtype (through fp32, the contract's working precision).
// cos/sin from libm in double, or the caller's table.
#include <cmath>
#include <cstdint>

#include "m3sa/numeric.h"
#include "registry/registry.h"

namespace m3sa::ref {
namespace {

double load(const TensorView& t, int64_t offset) {
  if (t.dtype == DType::bf16) return bf16_bits_to_float(t.ptr<const uint16_t>()[offset]);
  if (t.dtype == DType::fp8_e4m3) return e4m3_bits_to_float(t.ptr<const uint8_t>()[offset]);
  return t.ptr<const float>()[offset];
}

void store(const TensorView& t, int64_t offset, double value) {
  const float rounded = static_cast<float>(value);
  if (t.dtype == DType::bf16)
    t.ptr<uint16_t>()[offset] = float_to_bf16_bits(rounded);
  else
    t.ptr<uint8_t>()[offset] = float_to_e4m3_bits(rounded);
}

struct Rotation {
  double cos[kRotaryDim / 2], sin[kRotaryDim / 2];
};

Rotation rotation_at(const MsaConfig& config, const TensorView& table, int64_t position) {
  Rotation r;
  for (int i = 0; i < kRotaryDim / 2; ++i) {
    if (table.present()) {
      r.cos[i] = load(table, table.offset({position, i}));
      r.sin[i] = load(table, table.offset({position, i + kRotaryDim / 2}));
    } else {
      // The contract's cos/sin: of theta^(-i/32) rounded to fp32 times the position (exact in
      // double), rounded to fp32 like a caller's table would be.
      const float inv_freq = static_cast<float>(std::pow(config.rope_theta, -i / 32.0));
      const double angle = static_cast<double>(position) * inv_freq;
      r.cos[i] = static_cast<float>(std::cos(angle));
      r.sin[i] = static_cast<float>(std::sin(angle));
    }
  }
  return r;
}

// Row `row` of `in` (offset of its first element) normalised with `weight` and rotated; v rows
// (no weight) pass through.
void transform_row(const MsaConfig& config, const TensorView& in, int64_t row,
                   const TensorView* weight, const Rotation& rot, double (&y)[kHeadDim]) {
  for (int d = 0; d < kHeadDim; ++d) y[d] = load(in, row + d);
  if (weight == nullptr) return;
  double sum = 0;
  for (int d = 0; d < kHeadDim; ++d) sum += y[d] * y[d];
  const double inv_rms = 1.0 / std::sqrt(sum / kHeadDim + config.rms_norm_eps);
  for (int d = 0; d < kHeadDim; ++d)
    y[d] = y[d] * inv_rms * (config.norm_weight_offset + load(*weight, weight->offset({d})));
  for (int i = 0; i < kRotaryDim / 2; ++i) {
    const double x1 = y[i], x2 = y[i + kRotaryDim / 2];
    y[i] = x1 * rot.cos[i] - x2 * rot.sin[i];
    y[i + kRotaryDim / 2] = x2 * rot.cos[i] + x1 * rot.sin[i];
  }
}

Status plan(const PlanRequest&, const detail::DeviceCaps&, OpPlan* plan) {
  plan->num_threads = 1;
  plan->workspace_bytes = 0;
  return {};
}

Status norm_rope_insert(const OpPlan& plan, const NormRopeInsertArgs& a, Workspace,
                        const ExecContext&) {
  const MsaConfig& config = plan.request.config;
  const int64_t tokens = a.q.shape[0], q_heads = a.q.shape[1], kv_heads = a.k.shape[1];
  const int64_t index_heads = a.index_q.shape[1];
  double y[kHeadDim];
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t position = a.positions.ptr<const int64_t>()[t * a.positions.strides[0]];
    const Rotation rot = rotation_at(config, a.cos_sin_cache, position);
    const auto write = [&](const TensorView& out, int64_t first, double scale) {
      for (int d = 0; d < kHeadDim; ++d) store(out, first + d, y[d] / scale);
    };
    for (int64_t h = 0; h < q_heads; ++h) {
      transform_row(config, a.q, a.q.offset({t, h}), &a.q_norm_weight, rot, y);
      write(a.q_out, a.q_out.offset({t, h}), 1.0);
    }
    for (int64_t h = 0; h < index_heads; ++h) {
      transform_row(config, a.index_q, a.index_q.offset({t, h}), &a.index_q_norm_weight, rot, y);
      write(a.index_q_out, a.index_q_out.offset({t, h}), 1.0);
    }
    const int64_t slot = a.slot_mapping.ptr<const int64_t>()[t * a.slot_mapping.strides[0]];
    if (slot >= 0) {
      const int64_t page = slot / kBlockTokens, offset = slot % kBlockTokens;
      for (int64_t h = 0; h < kv_heads; ++h) {
        transform_row(config, a.k, a.k.offset({t, h}), &a.k_norm_weight, rot, y);
        write(a.k_cache, a.k_cache.offset({page, offset, h}), a.k_scale);
        transform_row(config, a.v, a.v.offset({t, h}), nullptr, rot, y);
        write(a.v_cache, a.v_cache.offset({page, offset, h}), a.v_scale);
      }
    }
    const int64_t index_slot =
        a.index_slot_mapping.ptr<const int64_t>()[t * a.index_slot_mapping.strides[0]];
    if (index_slot >= 0) {
      transform_row(config, a.index_k, a.index_k.offset({t}), &a.index_k_norm_weight, rot, y);
      write(a.index_k_cache,
            a.index_k_cache.offset({index_slot / kBlockTokens, index_slot % kBlockTokens}), 1.0);
    }
  }
  return {};
}

} // namespace
} // namespace m3sa::ref

namespace m3sa::detail {
extern const Implementation kReferenceNormRopeInsert;
const Implementation kReferenceNormRopeInsert = host_implementation(
    "reference.norm_rope_insert", "the oracle: every row in double, rounded once",
    Backend::reference, OpKind::norm_rope_insert, ref::plan, ref::norm_rope_insert);
} // namespace m3sa::detail
