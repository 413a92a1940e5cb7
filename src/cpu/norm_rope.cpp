// CPU norm_rope_insert: OpenMP over tokens; each row in the shared fp32 order of
// common/norm_rope_math.h, so the results equal the CUDA backend's bit for bit.
#include <cmath>
#include <cstdint>

#include "common/norm_rope_math.h"
#include "cpu/cpu.h"
#include "cpu/simd.h"
#include "m3sa/numeric.h"
#include "registry/registry.h"

namespace m3sa::cpu {
namespace {

namespace nr = detail::norm_rope;

const void* row_pointer(const TensorView& t, int64_t offset) {
  return static_cast<const char*>(t.data) + offset * dtype_size(t.dtype);
}

// offset + w, once per weight element.
struct Gains {
  float g[kHeadDim];
  Gains(const TensorView& weight, float offset) {
    float w[kHeadDim];
    load_row(weight.dtype, row_pointer(weight, 0), 1.f, w);
    for (int d = 0; d < kHeadDim; ++d) g[d] = nr::add(offset, w[d]);
  }
};

struct Rotation {
  float cos[nr::kRotaryPairs], sin[nr::kRotaryPairs];
};

// Normalises and rotates a row in place, in the order of the CUDA kernel's four lanes per row.
void normalize_and_rotate(float (&y)[kHeadDim], const Gains& gains, const Rotation& rot,
                          float eps) {
  float quarter_sums[nr::kQuarters];
  for (int q = 0; q < nr::kQuarters; ++q) {
    float x[nr::kQuarterElems];
    for (int k = 0; k < nr::kQuarterElems; ++k) x[k] = y[nr::quarter_dim(q, k)];
    quarter_sums[q] = nr::quarter_sum_of_squares(x);
  }
  const float inv_rms = nr::inverse_rms(
      nr::combine_quarters(quarter_sums[0], quarter_sums[1], quarter_sums[2], quarter_sums[3]),
      eps);
  for (int d = 0; d < kHeadDim; ++d) y[d] = nr::normalize(y[d], inv_rms, gains.g[d]);
  for (int i = 0; i < nr::kRotaryPairs; ++i) {
    const float x1 = y[i], x2 = y[i + nr::kRotaryPairs];
    y[i] = nr::rotate_first(x1, x2, rot.cos[i], rot.sin[i]);
    y[i + nr::kRotaryPairs] = nr::rotate_second(x1, x2, rot.cos[i], rot.sin[i]);
  }
}

void store_row(const TensorView& out, int64_t offset, const float (&y)[kHeadDim], float scale) {
  for (int d = 0; d < kHeadDim; ++d) {
    const float value = scale == 1.f ? y[d] : nr::divide(y[d], scale); // as the CUDA kernel
    if (out.dtype == DType::bf16)
      out.ptr<uint16_t>()[offset + d] = float_to_bf16_bits(value);
    else
      out.ptr<uint8_t>()[offset + d] = float_to_e4m3_bits(value);
  }
}

Status plan(const PlanRequest& request, const detail::DeviceCaps&, OpPlan* plan) {
  plan->num_threads = plan_threads(request);
  plan->workspace_bytes = 0;
  return {};
}

Status norm_rope_insert(const OpPlan& plan, const NormRopeInsertArgs& a, Workspace,
                        const ExecContext& ctx) {
  const MsaConfig& config = plan.request.config;
  const int num_threads = detail::run_threads(plan, ctx);
  const int64_t tokens = a.q.shape[0], q_heads = a.q.shape[1], kv_heads = a.k.shape[1];
  const int64_t index_heads = a.index_q.shape[1];
  const float offset = config.norm_weight_offset, eps = config.rms_norm_eps;
  const Gains q_gain(a.q_norm_weight, offset), k_gain(a.k_norm_weight, offset),
      iq_gain(a.index_q_norm_weight, offset), ik_gain(a.index_k_norm_weight, offset);
  float inv_freq[nr::kRotaryPairs];
  for (int i = 0; i < nr::kRotaryPairs; ++i)
    inv_freq[i] = nr::inverse_frequency(config.rope_theta, i);
  const TensorView& table = a.cos_sin_cache;

#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t position = a.positions.ptr<const int64_t>()[t * a.positions.strides[0]];
    Rotation rot;
    if (table.present()) {
      float both[kRotaryDim];
      load_rotary_row(table.dtype, row_pointer(table, table.offset({position})), both);
      for (int i = 0; i < nr::kRotaryPairs; ++i)
        rot.cos[i] = both[i], rot.sin[i] = both[i + nr::kRotaryPairs];
    } else {
      for (int i = 0; i < nr::kRotaryPairs; ++i)
        nr::rope_cos_sin(position, inv_freq[i], &rot.cos[i], &rot.sin[i]);
    }
    float y[kHeadDim];
    const auto transform = [&](const TensorView& in, int64_t row, const Gains* gains) {
      load_row(in.dtype, row_pointer(in, row), 1.f, y);
      if (gains) normalize_and_rotate(y, *gains, rot, eps);
    };
    for (int64_t h = 0; h < q_heads; ++h) {
      transform(a.q, a.q.offset({t, h}), &q_gain);
      store_row(a.q_out, a.q_out.offset({t, h}), y, 1.f);
    }
    for (int64_t h = 0; h < index_heads; ++h) {
      transform(a.index_q, a.index_q.offset({t, h}), &iq_gain);
      store_row(a.index_q_out, a.index_q_out.offset({t, h}), y, 1.f);
    }
    const int64_t slot = a.slot_mapping.ptr<const int64_t>()[t * a.slot_mapping.strides[0]];
    if (slot >= 0) {
      const int64_t page = slot / kBlockTokens, in_page = slot % kBlockTokens;
      for (int64_t h = 0; h < kv_heads; ++h) {
        transform(a.k, a.k.offset({t, h}), &k_gain);
        store_row(a.k_cache, a.k_cache.offset({page, in_page, h}), y, a.k_scale);
        transform(a.v, a.v.offset({t, h}), nullptr);
        store_row(a.v_cache, a.v_cache.offset({page, in_page, h}), y, a.v_scale);
      }
    }
    const int64_t index_slot =
        a.index_slot_mapping.ptr<const int64_t>()[t * a.index_slot_mapping.strides[0]];
    if (index_slot >= 0) {
      transform(a.index_k, a.index_k.offset({t}), &ik_gain);
      store_row(a.index_k_cache,
                a.index_k_cache.offset({index_slot / kBlockTokens, index_slot % kBlockTokens}), y,
                1.f);
    }
  }
  return {};
}

} // namespace
} // namespace m3sa::cpu

namespace m3sa::detail {
extern const Implementation kCpuNormRopeInsert;
const Implementation kCpuNormRopeInsert = host_implementation(
    "cpu.norm_rope_insert", "OpenMP over tokens, the fp32 order the CUDA kernel shares",
    Backend::cpu, OpKind::norm_rope_insert, cpu::plan, cpu::norm_rope_insert);
} // namespace m3sa::detail
