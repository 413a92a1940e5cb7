#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cuda_runtime.h>

#include <cstdint>

namespace m3sa::cuda {

// max that propagates NaN (contract §4: a block with any NaN product scores NaN).
// One FMNMX.NAN on SM80+ (max.NaN.f32 returns the canonical NaN 0x7fffffff), where the compare-
// and-select form compiled to a branch per element.
__device__ __forceinline__ float nan_propagating_max(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
#else
  return (a != a || b != b) ? __int_as_float(0x7fffffff) : fmaxf(a, b);
#endif
}

// Scores ordered as unsigned integers: larger is better, NaN below -inf, -0 equal to +0.
__device__ __forceinline__ uint32_t rank_key(float score) {
  if (score != score) return 0u;
  const uint32_t bits = __float_as_uint(score == 0.f ? 0.f : score);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// The packed-token -> request map: last r with cu_q_lens[r] <= t.
__device__ __forceinline__ int request_of_token(const int32_t* cu_q_lens, int num_requests, int t) {
  int lo = 0, hi = num_requests - 1, found = 0;
  while (lo <= hi) {
    const int mid = (lo + hi) >> 1;
    if (cu_q_lens[mid] <= t)
      found = mid, lo = mid + 1;
    else
      hi = mid - 1;
  }
  return found;
}

// 16 bytes global -> shared through L2 only (never a stale L1 line of data another SM wrote),
// asynchronously (cp.async, SM80+); fill false writes zeros and reads nothing.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool fill) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src),
               "r"(fill ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int kPending> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Exact widening of 2 stored values to a bf16 pair (e4m3 and bf16 both fit bf16 exactly).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// D += A x B on tensor cores, 16x8x16, bf16 or fp16 operands (TYPE), fp32 accumulation (SM80+).
#define M3SA_MMA_16816(TYPE)                                                                       \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE ".f32 {%0,%1,%2,%3}, "       \
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                                          \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                    \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  M3SA_MMA_16816("bf16");
}
__device__ __forceinline__ void mma_f16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
  M3SA_MMA_16816("f16");
}
#undef M3SA_MMA_16816
// The same on fp16 operands with kHalf, bf16 without.
template <bool kHalf>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (kHalf)
    mma_f16_16816(c, a, b0, b1);
  else
    mma_bf16_16816(c, a, b0, b1);
}

// A word's four e4m3 values widened to fp16 pairs (exact: every e4m3 value is an fp16 value; one
// conversion per two values): its low two bytes to `low`, its high two to `high`. From SM89 the
// register's halves are converted where they are, not shifted out first.
__device__ __forceinline__ void widen_e4m3x4_to_half2x2(uint32_t word, uint32_t& low,
                                                        uint32_t& high) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n"
      " cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(low), "=r"(high)
      : "r"(word));
#else
  const __half2_raw l = __nv_cvt_fp8x2_to_halfraw2(word & 0xffffu, __NV_E4M3);
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(word >> 16, __NV_E4M3);
  low = static_cast<uint32_t>(l.x) | (static_cast<uint32_t>(l.y) << 16);
  high = static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
#endif
}

// A bf16 pair times `scale` as an fp16 pair, rounded to nearest (exact where fp16 holds the
// product).
__device__ __forceinline__ uint32_t bf16x2_to_half2(uint32_t w, float scale = 1.f) {
  const __half2 h = __floats2half2_rn(__uint_as_float(w << 16) * scale,
                                      __uint_as_float(w & 0xffff0000u) * scale);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// 16 e4m3 values widened to 16 fp16, order kept: out[i] holds values 2 i and 2 i + 1.
__device__ __forceinline__ void widen_e4m3x16_to_half(uint4 raw, uint32_t (&out)[8]) {
  widen_e4m3x4_to_half2x2(raw.x, out[0], out[1]);
  widen_e4m3x4_to_half2x2(raw.y, out[2], out[3]);
  widen_e4m3x4_to_half2x2(raw.z, out[4], out[5]);
  widen_e4m3x4_to_half2x2(raw.w, out[6], out[7]);
}

// 16 e4m3 values widened to 16 bf16 (exact: every e4m3 value is a bf16 value), order kept:
// out[i] holds values 2 i and 2 i + 1.
__device__ __forceinline__ void widen_e4m3x16(uint4 raw, uint32_t (&out)[8]) {
  const uint16_t* pairs = reinterpret_cast<const uint16_t*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pairs[i], __NV_E4M3)));
    out[i] = pack_bf16x2(f.x, f.y);
  }
}
__device__ __forceinline__ void widen_e4m3x16_to_bf16(uint4 raw, uint4* dst) {
  uint32_t out[8];
  widen_e4m3x16(raw, out);
  dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
  dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
}

// Eight fp32 values rounded once to a stored 8-element chunk: 16 bytes of bf16 (RNE) or 8 bytes of
// e4m3 (RNE, saturating to +-448), the element order kept.
__device__ __forceinline__ uint4 round_to_bf16x8(const float* v) {
  return make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]),
                    pack_bf16x2(v[6], v[7]));
}
__device__ __forceinline__ uint2 round_to_e4m3x8(const float* v) {
  uint32_t half[4]; // two e4m3 bytes each
#pragma unroll
  for (int i = 0; i < 4; ++i)
    half[i] =
        __nv_cvt_float2_to_fp8x2(make_float2(v[2 * i], v[2 * i + 1]), __NV_SATFINITE, __NV_E4M3);
  return make_uint2(half[0] | (half[1] << 16), half[2] | (half[3] << 16));
}

// A 16-byte chunk of 8 bf16 values widened to fp32 (exact).
__device__ __forceinline__ void widen_bf16x8(uint4 raw, float* v) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(pairs[i]);
    v[2 * i] = f.x, v[2 * i + 1] = f.y;
  }
}

// A hint: the 128-byte line holding `p` is brought into L2 (nothing is read into the SM, and
// the instruction never faults).
__device__ __forceinline__ void prefetch_to_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

// A load issued here, not where its value is first used: the compiler sinks a plain load past a
// branch whose other side does not need it, which serialises it behind the loads the branch
// waits for (one more dependent round trip).
__device__ __forceinline__ int32_t load_before_branch(const int32_t* p) {
  int32_t v;
  asm volatile("ld.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}

// The GPU's global nanosecond timer (comparable across SMs, unlike clock64): the diagnostic
// stamps' wall times (decode_stamps.cuh, scorer_stamps.cuh).
__device__ __forceinline__ unsigned long long globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---- programmatic dependent launch (LaunchOptions::overlap_prior) ----------------------------
// A kernel launched with overlap_prior may start while the stream's previous grid still runs: it
// calls wait_for_prior_grids before it touches global memory (set-up of shared memory and
// barriers may come first). allow_next_grid lets the stream's next grid, when launched with
// overlap_prior, start as this one's CTAs finish (it still waits for this whole grid before it
// touches memory). Both are no-ops for launches without the attribute and on targets before SM90.
__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
// Brings a __grid_constant__ parameter block into the constant cache before wait_for_prior_grids:
// thread 0 reads one 32-bit word every 64 bytes and stores their xor to a shared word nobody reads
// (a volatile store, so that neither the compiler nor ptxas drops the reads), where the reads
// overlap the previous grid. Why: ncu (bench/NOTES.md s16 r4) put ~14 % of a batch-1 decode
// indexer's warp samples on constant-cache misses of the first parameter reads, made after the
// wait, on the critical path.
template <typename Params> __device__ __forceinline__ void touch_parameters(const Params& params) {
  __shared__ uint32_t sink;
  if (threadIdx.x != 0) return;
  const uint32_t* words = reinterpret_cast<const uint32_t*>(&params);
  uint32_t folded = 0;
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(Params) / 4); i += 16) folded ^= words[i];
  *static_cast<volatile uint32_t*>(&sink) = folded;
}
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// How a kernel is launched beyond grid, block and shared memory.
struct LaunchOptions {
  int cluster = 1; // CTAs per thread-block cluster along x (1: no cluster attribute)
  // Programmatic dependent launch: the kernel may start while the stream's previous kernel is
  // still running, and waits for it (wait_for_prior_grids) before it touches memory. SM90 only.
  bool overlap_prior = false;
  int cluster_y = 1; // and along y (the decode indexer's ranges of a tile)
};

// Whether `kernel`'s attributes on `device` were already set for `smem` bytes of dynamic shared
// memory (or more) and, with `nonportable_cluster`, clusters above 8 CTAs; and the record of a
// successful set (control.cu: a small table under a mutex). cudaFuncSetAttribute is a driver call
// of ~0.2 us of host time (bench/micro/launch_cost.cu, H200), two of them before every cluster
// launch of 16 CTAs (itself ~2.2 us), and the attributes stay set in the device's context, so a
// launch sets them once per kernel and device. (A cudaDeviceReset drops the context's attributes
// but not this record: the next launch then fails with a CUDA error, returned as a Status.)
bool launch_attributes_recorded(const void* kernel, int device, int smem, bool nonportable_cluster);
void record_launch_attributes(const void* kernel, int device, int smem, bool nonportable_cluster);

// Launches `kernel` with `smem` bytes of dynamic shared memory (above the 48 KB default, so the
// attribute is set first; clusters above the portable 8 allowed), clusters and programmatic
// dependent launch as `options` asks; returns the first error.
// The kernel attributes a launch (or an occupancy query) with `smem` bytes of dynamic shared
// memory in clusters of `cluster` CTAs needs: the shared-memory size above the 48 KB default, and
// for clusters above the portable 8 the non-portable size; set once per kernel and device.
template <typename Params>
cudaError_t set_launch_attributes(void (*kernel)(Params), int smem, int cluster) {
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  const void* key = reinterpret_cast<const void*>(kernel);
  if (e != cudaSuccess || launch_attributes_recorded(key, device, smem, cluster > 8)) return e;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e == cudaSuccess && cluster > 8)
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (e == cudaSuccess) record_launch_attributes(key, device, smem, cluster > 8);
  return e;
}

template <typename Params>
cudaError_t launch_with_shared_memory(void (*kernel)(Params), dim3 grid, int threads, int smem,
                                      cudaStream_t stream, const Params& params,
                                      LaunchOptions options = {}) {
  const cudaError_t e = set_launch_attributes(kernel, smem, options.cluster * options.cluster_y);
  if (e != cudaSuccess) return e;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attributes[2] = {};
  if (options.cluster > 1 || options.cluster_y > 1) {
    cudaLaunchAttribute& a = attributes[config.numAttrs++];
    a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = static_cast<unsigned>(options.cluster);
    a.val.clusterDim.y = static_cast<unsigned>(options.cluster_y);
    a.val.clusterDim.z = 1;
  }
  if (options.overlap_prior) {
    cudaLaunchAttribute& a = attributes[config.numAttrs++];
    a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a.val.programmaticStreamSerializationAllowed = 1;
  }
  config.attrs = attributes;
  return cudaLaunchKernelEx(&config, kernel, params);
}

// How many clusters of `cluster_x` x `cluster_y` CTAs (2..16 in all) of `threads` threads and
// `smem` bytes of dynamic shared memory the current device holds at once: 0 where the kernel has
// no SM90 code (cluster code is compiled for SM90 only) or the device cannot run such a cluster.
// Plan time only.
template <typename Params>
int active_clusters(void (*kernel)(Params), int threads, int smem, int cluster_x, int cluster_y) {
  const int ctas = cluster_x * cluster_y;
  cudaFuncAttributes attributes{};
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(cluster_x, cluster_y);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(cluster_x);
  attribute.val.clusterDim.y = static_cast<unsigned>(cluster_y);
  attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  int clusters = 0;
  if (ctas < 2 || ctas > 16 || cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess ||
      attributes.ptxVersion < 90 || set_launch_attributes(kernel, smem, ctas) != cudaSuccess ||
      cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
    (void)cudaGetLastError(); // a refusal here only means: no clusters
    return 0;
  }
  return clusters;
}

// Whether `kernel` was built for sm_90a (a kernel JIT-compiled from the portable PTX has an empty
// body: ptxVersion 80), with at least `launch_registers` a thread where a setmaxnreg split assumes
// that launch allocation.
template <typename Kernel> bool has_sm90a_code(Kernel kernel, int launch_registers = 0) {
  cudaFuncAttributes attributes{};
  return cudaFuncGetAttributes(&attributes, kernel) == cudaSuccess && attributes.ptxVersion >= 90 &&
         attributes.numRegs >= launch_registers;
}

} // namespace m3sa::cuda
