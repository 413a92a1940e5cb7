#pragma once
// Diagnostic builds only (never in the library): with M3SA_ATTENTION_DECODE_STAMPS, thread 0 of
// every CTA of a decode attention kernel's 20th launch records clock64 at the item's phases (0
// entry, 1 after the PDL wait, 2 selection resolved, 3 first stage landed, 4 stream done, 5 item
// finished; the persistent kernel keeps its last item's), and the last CTA of that launch prints
// them (device printf, flushed at the host's next synchronisation). Built by
// bench/micro/stamped_m3sa.sh into .gpu/m3sa_stamps (both decode kernels in bf16, the TMA one in
// e4m3 too). The decode indexer's TMA kernel (decode_topk_sm90.cuh) stamps the same table: 1 tile
// begun, 2 warp 0's first box landed, 3 warp 0's stream done, 4 every warp's, 5 CTA done; its
// finish stamps: published and arrived (every CTA), staged, floor, ranked (a tile's last CTA); with
// one range a tile: merge reached, row begun, floor, ranked.
#include <cstdio>

#ifndef M3SA_ATTENTION_DECODE_STAMPS
#define M3SA_ATTENTION_DECODE_STAMPS 0
#endif
// With M3SA_ATTENTION_DECODE_SELECT_STAMPS as well, the four finish slots record the cp.async
// kernel's selection instead (select_blocks: the first round of loads back, the table entries
// back, the selection written, the CTA barrier passed), each stamp issued after a store of the
// values it waits for, so that it cannot run ahead of their loads.
#ifndef M3SA_ATTENTION_DECODE_SELECT_STAMPS
#define M3SA_ATTENTION_DECODE_SELECT_STAMPS 0
#endif

#if M3SA_ATTENTION_DECODE_STAMPS
#include "cuda/kernels/common.cuh"

namespace m3sa::cuda {

struct DecodeStamps {
  long long clock[6];
  unsigned long long entry_ns, exit_ns;
  int sm, last;
};
inline constexpr int kStampedLaunch = 20, kStampedCtas = 2048;
// Internal linkage: each kernel's translation unit counts its own launches.
static __device__ DecodeStamps g_decode_stamps[kStampedCtas];
static __device__ unsigned g_decode_launch, g_decode_arrivals;
// Inside the finish (clock64 of thread 0: warps merged, partial pushed, pushes received, rows
// written), every launch; printed after the phase stamps.
static __device__ long long g_decode_finish_stamps[kStampedCtas][4];
static __device__ int g_decode_stamp_sink;

// The CTA's row in the table: grid x, then y (the decode indexer's grid is tiles x splits).
static __device__ __forceinline__ unsigned decode_stamp_cta() {
  return blockIdx.x + blockIdx.y * gridDim.x;
}

// Thread 0: this CTA's stamps into the launch's table; the last CTA prints the table.
static __device__ __noinline__ void record_decode_stamps(DecodeStamps stamp, int splits, int last) {
  if (threadIdx.x != 0) return;
  const unsigned launch = *reinterpret_cast<volatile unsigned*>(&g_decode_launch);
  stamp.exit_ns = globaltimer_ns();
  stamp.last = last;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(stamp.sm));
  const unsigned cta = decode_stamp_cta(), ctas = gridDim.x * gridDim.y;
  if (launch == kStampedLaunch && cta < kStampedCtas) g_decode_stamps[cta] = stamp;
  __threadfence();
  if (atomicAdd(&g_decode_arrivals, 1) != ctas - 1) return;
  g_decode_arrivals = 0;
  if (launch == kStampedLaunch) {
    __threadfence();
    const int n = min(static_cast<int>(ctas), kStampedCtas);
    unsigned long long t0 = ~0ull;
    for (int c = 0; c < n; ++c) t0 = min(t0, g_decode_stamps[c].entry_ns);
    unsigned cluster = 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(cluster));
#endif
    constexpr bool kSelect = M3SA_ATTENTION_DECODE_SELECT_STAMPS != 0;
    printf(kSelect ? "stamps grid %d cluster %u splits %d (cycles: wait select first_stage stream "
                     "finish | select: first_loads table_entries written barrier rest)\n"
                   : "stamps grid %d cluster %u splits %d (cycles: wait select first_stage stream "
                     "finish | finish: warps_merged pushed received written rest)\n",
           gridDim.x, cluster, splits);
    for (int c = 0; c < n; ++c) {
      const DecodeStamps& d = g_decode_stamps[c];
      const long long* f = g_decode_finish_stamps[c];
      const long long from = kSelect ? d.clock[1] : d.clock[4],
                      to = kSelect ? d.clock[2] : d.clock[5];
      printf("stamp cta %d sm %d last %d entry_ns %llu exit_ns %llu | %lld %lld %lld %lld %lld | "
             "%lld %lld %lld %lld %lld\n",
             c, d.sm, d.last, d.entry_ns - t0, d.exit_ns - t0, d.clock[1] - d.clock[0],
             d.clock[2] - d.clock[1], d.clock[3] - d.clock[2], d.clock[4] - d.clock[3],
             d.clock[5] - d.clock[4], f[0] - from, f[1] - f[0], f[2] - f[1], f[3] - f[2],
             to - f[3]);
    }
  }
  atomicAdd(&g_decode_launch, 1);
}

} // namespace m3sa::cuda
#define M3SA_DECODE_STAMPS_BEGIN()                                                                 \
  DecodeStamps stamp{};                                                                            \
  if (threadIdx.x == 0) stamp.entry_ns = globaltimer_ns()
#define M3SA_DECODE_STAMP(i)                                                                       \
  if (threadIdx.x == 0) stamp.clock[i] = clock64()
#define M3SA_DECODE_STAMPS_END(splits, last) record_decode_stamps(stamp, splits, last)
#if M3SA_ATTENTION_DECODE_SELECT_STAMPS
#define M3SA_DECODE_FINISH_STAMP(i)
#define M3SA_DECODE_SELECT_STAMP(i, value)                                                         \
  if (threadIdx.x == 0 && decode_stamp_cta() < kStampedCtas) {                                     \
    *reinterpret_cast<volatile int*>(&g_decode_stamp_sink) = static_cast<int>(value);              \
    g_decode_finish_stamps[decode_stamp_cta()][i] = clock64();                                     \
  }
#else
#define M3SA_DECODE_FINISH_STAMP(i)                                                                \
  if (threadIdx.x == 0 && decode_stamp_cta() < kStampedCtas)                                       \
  g_decode_finish_stamps[decode_stamp_cta()][i] = clock64()
#define M3SA_DECODE_SELECT_STAMP(i, value)
#endif
#else
#define M3SA_DECODE_STAMPS_BEGIN()
#define M3SA_DECODE_STAMP(i)
#define M3SA_DECODE_STAMPS_END(splits, last)
#define M3SA_DECODE_FINISH_STAMP(i)
#define M3SA_DECODE_SELECT_STAMP(i, value)
#endif
