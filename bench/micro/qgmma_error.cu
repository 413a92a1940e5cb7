// How far Hopper's e4m3 wgmma (QGMMA) is from the exact dot products the index scores need: the
// measurement behind issue 12's fp8 route (bench/NOTES.md s10, "Next round, first" (2)).
//
// Why: the SM90 scorer widens e4m3 pages to bf16 and runs bf16 wgmma, which sums exactly like the
// portable kernel - so fp8 runs at the bf16 time, while e4m3 wgmma would double the MMA rate. Its
// selections differed from the exact ones in 0.5-0.9 % of random-data rows (s5 r2). A two-pass
// scheme - QGMMA block maxima, then the candidates within an error bound of the K-th score
// re-scored exactly - needs that bound measured: this prints it.
//
// Each CTA (one warpgroup) draws a 64 x 128 e4m3 query tile and a 128-key e4m3 page (normal values
// quantised with saturation; the keys' scale varies by CTA), computes Q.K^T three ways and, per
// query row, the block maximum over the 128 keys:
//   accumulate: four m64n128k32 QGMMAs into one accumulator (what a plain port would do);
//   promoted:   each QGMMA into a zeroed accumulator, added to an fp32 one (DeepGEMM's promotion);
//   exact:      the double-precision sum of the exact e4m3 products (CUDA cores).
// Printed: quantiles of |block max - exact block max|, absolute and relative to sum_k |q_k k_k| of
// the exact argmax key (the scale an error bound can be stated in), and the largest element error.
//
// Build: bench/micro/build.sh qgmma_error (-> .gpu/qgmma_error). Run: .gpu/qgmma_error [ctas]
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/kernels/sm90/hopper.cuh"

#include "micro_check.h"

namespace {

using namespace m3sa::cuda;

constexpr int kRows = 64, kKeys = 128, kDims = 128;
constexpr int kSmemBytes = 1024 + kRows * kDims + kKeys * kDims;

// A standard normal value from two hashes (Box-Muller), times `scale`, as e4m3 (saturating).
__device__ uint8_t normal_e4m3(uint32_t seed, float scale) {
  const float u1 = (hash32(seed) + 1.f) * 2.3283064e-10f,
              u2 = hash32(seed ^ 0x9e3779b9u) * 2.3283064e-10f;
  const float x = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2) * scale;
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

__device__ float e4m3_value(uint8_t v) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(v, __NV_E4M3)));
}

// Per CTA and query row: [exact max, accumulate max, promoted max, sum |q k| of the exact argmax];
// per CTA: the largest element error of each QGMMA form (max_error[2 blockIdx.x + form]).
__global__ void __launch_bounds__(128, 1) qgmma_error_kernel(float4* rows, float* max_error) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* a = sm90::align_to_swizzle_atom(smem_raw); // [64 rows][128 B], 128 B swizzle
  uint8_t* b = a + kRows * kDims;                     // [128 keys][128 B]
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const float key_scale = 0.25f * static_cast<float>(1 + blockIdx.x % 16); // 0.25 .. 4
  // Element (row, dim) sits in 16-byte chunk dim / 16 of its row, swizzled.
  for (int i = t; i < kRows * kDims; i += 128) {
    const int row = i / kDims, dim = i % kDims;
    a[sm90::swizzled_offset(row, dim / 16) + dim % 16] =
        normal_e4m3(blockIdx.x * 1000003u + i, 1.f);
  }
  for (int i = t; i < kKeys * kDims; i += 128) {
    const int key = i / kDims, dim = i % kDims;
    b[sm90::swizzled_offset(key, dim / 16) + dim % 16] =
        normal_e4m3(0x5bd1e995u + blockIdx.x * 1000003u + i, key_scale);
  }
  sm90::fence_proxy_async_shared();
  __syncthreads();
  const uint32_t a_base = sm90::shared_address(a), b_base = sm90::shared_address(b);
  float acc[64], promoted[64], step[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) promoted[i] = 0.f;
  sm90::fence_accumulators(acc);
  sm90::wgmma_fence();
#pragma unroll
  for (int k = 0; k < 4; ++k) // 32 bytes = 32 dims of the 128-byte row per instruction
    sm90::wgmma_m64n128k32_e4m3(acc, sm90::operand_descriptor(a_base + 32 * k),
                                sm90::operand_descriptor(b_base + 32 * k), k);
  sm90::wgmma_commit_group();
  sm90::wgmma_wait_all();
  sm90::fence_accumulators(acc);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    sm90::fence_accumulators(step);
    sm90::wgmma_fence();
    sm90::wgmma_m64n128k32_e4m3(step, sm90::operand_descriptor(a_base + 32 * k),
                                sm90::operand_descriptor(b_base + 32 * k), 0);
    sm90::wgmma_commit_group();
    sm90::wgmma_wait_all();
    sm90::fence_accumulators(step);
#pragma unroll
    for (int i = 0; i < 64; ++i) promoted[i] += step[i];
  }
  // Value d[4 i + 2 h + e]: row 16 warp + lane / 4 + 8 h, key 8 i + 2 (lane % 4) + e.
  float worst[2] = {0.f, 0.f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = 16 * warp + lane / 4 + 8 * h;
    double best = -INFINITY, best_abs = 0.0;
    float best_acc = -INFINITY, best_promoted = -INFINITY;
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = 8 * i + 2 * (lane % 4) + e;
        double exact = 0.0, magnitude = 0.0;
        for (int dim = 0; dim < kDims; ++dim) {
          const double p =
              static_cast<double>(e4m3_value(a[sm90::swizzled_offset(row, dim / 16) + dim % 16])) *
              e4m3_value(b[sm90::swizzled_offset(key, dim / 16) + dim % 16]);
          exact += p, magnitude += fabs(p);
        }
        const float d_acc = acc[4 * i + 2 * h + e], d_promoted = promoted[4 * i + 2 * h + e];
        worst[0] = fmaxf(worst[0], static_cast<float>(fabs(d_acc - exact)));
        worst[1] = fmaxf(worst[1], static_cast<float>(fabs(d_promoted - exact)));
        if (exact > best) best = exact, best_abs = magnitude;
        best_acc = fmaxf(best_acc, d_acc), best_promoted = fmaxf(best_promoted, d_promoted);
      }
    // The row's 128 keys are spread over the quad's 4 lanes.
    for (int offset = 1; offset < 4; offset <<= 1) {
      const double other = __shfl_xor_sync(0xffffffffu, best, offset);
      const double other_abs = __shfl_xor_sync(0xffffffffu, best_abs, offset);
      if (other > best) best = other, best_abs = other_abs;
      best_acc = fmaxf(best_acc, __shfl_xor_sync(0xffffffffu, best_acc, offset));
      best_promoted = fmaxf(best_promoted, __shfl_xor_sync(0xffffffffu, best_promoted, offset));
    }
    if (lane % 4 == 0)
      rows[blockIdx.x * kRows + row] = make_float4(static_cast<float>(best), best_acc,
                                                   best_promoted, static_cast<float>(best_abs));
  }
  for (int f = 0; f < 2; ++f) {
    for (int offset = 16; offset > 0; offset >>= 1)
      worst[f] = fmaxf(worst[f], __shfl_xor_sync(0xffffffffu, worst[f], offset));
    if (lane == 0)
      atomicMax(reinterpret_cast<int*>(&max_error[2 * blockIdx.x + f]),
                __float_as_int(worst[f])); // non-negative floats order as ints
  }
#endif
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5))];
}

} // namespace

int main(int argc, char** argv) {
  const int ctas = argc > 1 ? std::atoi(argv[1]) : 4096;
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  float4* rows = nullptr;
  float* max_error = nullptr;
  CK(cudaMalloc(&rows, sizeof(float4) * ctas * kRows));
  CK(cudaMalloc(&max_error, sizeof(float) * 2 * ctas));
  CK(cudaMemset(max_error, 0, sizeof(float) * 2 * ctas));
  CK(cudaFuncSetAttribute(qgmma_error_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          kSmemBytes));
  qgmma_error_kernel<<<ctas, 128, kSmemBytes>>>(rows, max_error);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float4> host(static_cast<size_t>(ctas) * kRows);
  std::vector<float> errors(2 * static_cast<size_t>(ctas));
  CK(cudaMemcpy(host.data(), rows, sizeof(float4) * host.size(), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(errors.data(), max_error, sizeof(float) * errors.size(), cudaMemcpyDeviceToHost));
  std::printf("qgmma_error on %s: %d CTAs x %d rows, 128 keys of 128 dims, keys scaled 0.25-4\n",
              prop.name, ctas, kRows);
  const char* names[2] = {"accumulate", "promoted"};
  for (int f = 0; f < 2; ++f) {
    std::vector<double> abs_err, rel_err;
    for (const float4& r : host) {
      const double got = f == 0 ? r.y : r.z;
      abs_err.push_back(std::fabs(got - r.x));
      rel_err.push_back(r.w > 0 ? std::fabs(got - r.x) / r.w : 0.0);
    }
    float worst = 0.f;
    for (int c = 0; c < ctas; ++c) worst = std::max(worst, errors[2 * c + f]);
    std::printf("%-10s block-max error: abs p50 %.3g p99 %.3g p99.9 %.3g p99.99 %.3g max %.3g | "
                "/ sum|qk| p50 %.3g p99 %.3g p99.9 %.3g p99.99 %.3g max %.3g | element max %.3g\n",
                names[f], quantile(abs_err, 0.5), quantile(abs_err, 0.99), quantile(abs_err, 0.999),
                quantile(abs_err, 0.9999), quantile(abs_err, 1.0), quantile(rel_err, 0.5),
                quantile(rel_err, 0.99), quantile(rel_err, 0.999), quantile(rel_err, 0.9999),
                quantile(rel_err, 1.0), worst);
  }
  CK(cudaFree(rows));
  CK(cudaFree(max_error));
  return 0;
}
