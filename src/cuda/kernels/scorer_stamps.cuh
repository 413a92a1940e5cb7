#pragma once
// Diagnostic builds only (never in the library): with M3SA_SCORER_STAMPS, the SM90 scorer
// (score_blocks_sm90.cuh) adds up, in every CTA of its 20th launch, where each warpgroup's cycles
// go: the consumers' query staging, their waits for a page, their MMAs (issue to wait_all) and
// their block maxima; the producer's waits for a free stage; with the CTA's entry, start after the
// PDL wait and exit (globaltimer, ns from the launch's first entry), units and blocks. A kernel
// queued after that launch prints the table (device printf, flushed at the host's next
// synchronisation; if that launch was captured into a graph, at every replay). Built by
// bench/micro/scorer_stamps.sh into .gpu/m3sa_scorer_stamps; read in bench/NOTES.md s19 r1 / r2.
#ifndef M3SA_SCORER_STAMPS
#define M3SA_SCORER_STAMPS 0
#endif

#if M3SA_SCORER_STAMPS
#include <cstdio>

#include "cuda/kernels/common.cuh"

namespace m3sa::cuda {

struct ScorerStamps {
  unsigned long long entry_ns, start_ns, exit_ns;
  long long staging[2], page_wait[2], mma[2], maxima[2], producer_wait;
  int units, blocks, sm;
};
inline constexpr int kScorerStampedLaunch = 20, kScorerStampedCtas = 1024;
static __device__ ScorerStamps g_scorer_stamps[kScorerStampedCtas];

static __device__ __forceinline__ ScorerStamps* scorer_stamps_row() {
  return blockIdx.x < kScorerStampedCtas ? &g_scorer_stamps[blockIdx.x] : nullptr;
}

// The table of the launch just made, printed by a one-thread kernel the host launcher queues after
// the scorer's kStampedLaunch-th launch (a call inside the scorer would make ptxas serialise its
// wgmma: C7510).
static __global__ void print_scorer_stamps_kernel(int grid) {
  const int n = min(grid, kScorerStampedCtas);
  unsigned long long t0 = ~0ull;
  for (int c = 0; c < n; ++c) t0 = min(t0, g_scorer_stamps[c].entry_ns);
  printf("scorer stamps grid %d (ns: entry start exit | units blocks | cycles: staging, page "
         "wait, mma, maxima for consumers 0 / 1 | producer wait)\n",
         grid);
  for (int c = 0; c < n; ++c) {
    const ScorerStamps& s = g_scorer_stamps[c];
    printf("sstamp cta %d sm %d | %llu %llu %llu | %d %d | %lld %lld %lld %lld / %lld %lld %lld "
           "%lld | %lld\n",
           c, s.sm, s.entry_ns - t0, s.start_ns - t0, s.exit_ns - t0, s.units, s.blocks,
           s.staging[0], s.page_wait[0], s.mma[0], s.maxima[0], s.staging[1], s.page_wait[1],
           s.mma[1], s.maxima[1], s.producer_wait);
  }
}

// Host side: after the scorer's launch, the print kernel on the same stream at the stamped one.
inline void after_scorer_launch(int grid, cudaStream_t stream) {
  static int launches = 0;
  if (++launches == kScorerStampedLaunch) print_scorer_stamps_kernel<<<1, 1, 0, stream>>>(grid);
}

} // namespace m3sa::cuda
// Cycle accounting of one thread (a warpgroup's thread 0), in registers until the exit (a global
// read-modify-write a span would add its own latency): M3SA_SCORER_SPAN(var) opens a span,
// M3SA_SCORER_ADD(var, what) adds its cycles to kStamp<what> and opens the next.
enum ScorerStampSlot { kStampStaging, kStampPageWait, kStampMma, kStampMaxima, kStampSlots };
#define M3SA_SCORER_STAMPS_ENTRY()                                                                 \
  long long stamp_cycles[kStampSlots] = {};                                                        \
  int stamp_units = 0, stamp_blocks = 0;                                                           \
  if (threadIdx.x == 0 && scorer_stamps_row() != nullptr) {                                        \
    *scorer_stamps_row() = ScorerStamps{};                                                         \
    scorer_stamps_row()->entry_ns = globaltimer_ns();                                              \
  }                                                                                                \
  __syncthreads()
#define M3SA_SCORER_STAMPS_START()                                                                 \
  if (threadIdx.x == 0 && scorer_stamps_row() != nullptr) {                                        \
    scorer_stamps_row()->start_ns = globaltimer_ns();                                              \
    asm volatile("mov.u32 %0, %%smid;" : "=r"(scorer_stamps_row()->sm));                           \
  }
#define M3SA_SCORER_SPAN(var) long long var = clock64()
#define M3SA_SCORER_ADD(var, what)                                                                 \
  {                                                                                                \
    const long long now_ = clock64();                                                              \
    stamp_cycles[kStamp##what] += now_ - var;                                                      \
    var = now_;                                                                                    \
  }
#define M3SA_SCORER_COUNT(units, blocks) stamp_units += (units), stamp_blocks += (blocks)
// The producer's waits for a free stage are counted in its kStampPageWait slot.
#define M3SA_SCORER_PRODUCER_DONE()                                                                \
  if (threadIdx.x == 0 && scorer_stamps_row() != nullptr) {                                        \
    scorer_stamps_row()->producer_wait = stamp_cycles[kStampPageWait];                             \
    __threadfence();                                                                               \
  }
#define M3SA_SCORER_STAMPS_EXIT()                                                                  \
  if (threadIdx.x % 128 == 0 && scorer_stamps_row() != nullptr) {                                  \
    ScorerStamps* row_ = scorer_stamps_row();                                                      \
    const int c_ = threadIdx.x / 128 - 1;                                                          \
    row_->staging[c_] = stamp_cycles[kStampStaging];                                               \
    row_->page_wait[c_] = stamp_cycles[kStampPageWait];                                            \
    row_->mma[c_] = stamp_cycles[kStampMma];                                                       \
    row_->maxima[c_] = stamp_cycles[kStampMaxima];                                                 \
    if (c_ == 0) row_->units = stamp_units, row_->blocks = stamp_blocks;                           \
  }                                                                                                \
  sm90::named_barrier_sync(3, 256);                                                                \
  if (threadIdx.x == 128 && scorer_stamps_row() != nullptr)                                        \
  scorer_stamps_row()->exit_ns = globaltimer_ns()
#else
#define M3SA_SCORER_STAMPS_ENTRY()
#define M3SA_SCORER_STAMPS_START()
#define M3SA_SCORER_SPAN(var)
#define M3SA_SCORER_ADD(var, what)
#define M3SA_SCORER_COUNT(units, blocks)
#define M3SA_SCORER_PRODUCER_DONE()
#define M3SA_SCORER_STAMPS_EXIT()
namespace m3sa::cuda {
inline void after_scorer_launch(int, cudaStream_t) {}
} // namespace m3sa::cuda
#endif
