// Attention-math rate of the decode attention's warps, with K and V already in shared memory (no
// HBM): how many stages an SM retires per microsecond with W warps a CTA and C CTAs an SM, running
// the library's own device code (attend_keys over TMA-layout tiles for bf16, attend_e4m3_slot for
// e4m3; src/cuda/kernels/sparse_attention_decode_sm90.cuh).
//
// Why: the TMA decode kernel's copies alone stream at 95 % of the copy rate while the attention
// alone takes 58.8 of its 142 us at B=128 S=128K 64/4 (bench/NOTES.md s9 r3): a warp's stage is
// latency-bound (~1,500 cycles for 16 keys with two warps a scheduler). To keep up with HBM an SM
// must retire ~3.7 stages of 8 KB a microsecond (30 GB/s an SM). This measures the rate for the
// shapes a redesign could take (more warps a CTA, more CTAs an SM, fewer registers a thread), so
// the next kernel is chosen from numbers instead of guesses.
//
// Build: bench/micro/build.sh attend_rate (-> .gpu/attend_rate). Run: .gpu/attend_rate [--iters N]
// Prints one line per configuration: cycles a stage per warp, stages a microsecond per SM, and the
// GB/s an SM this rate could consume (8 KB a stage), against the ~30 GB/s the copy rate allows.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/kernels/sparse_attention_decode_sm90.cuh"

#include "micro_check.h"

namespace {

using namespace m3sa::cuda;

constexpr int kSlotBytes = 8192; // one ring slot: K then V (bf16 16 keys, e4m3 32 keys)

// Each warp attends over its own resident slot `iters` times (its partial goes to `sink`, so
// nothing is optimised away); cycles[warp] = its clock64 span.
template <bool kFp8, int kWarps, int kCtasPerSm>
__global__ void __launch_bounds__(kWarps * 32, kCtasPerSm)
    attend_rate_kernel(int iters, float* sink, long long* cycles) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* slots = sm90::align_to_swizzle_atom(smem_raw);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint8_t* slot = slots + warp * kSlotBytes;
  // Finite values: bf16 in [-1, 1) (exponent <= 126), e4m3 bytes with exponent < 15.
  for (int i = lane; i < kSlotBytes / 4; i += 32) {
    const uint32_t h = hash32(blockIdx.x * 65536u + warp * 4096u + i);
    reinterpret_cast<uint32_t*>(slot)[i] = kFp8 ? (h & 0x77777777u) : (h & 0xbe7fbe7fu);
  }
  uint32_t q[8][4];
  for (int ks = 0; ks < 8; ++ks)
    for (int r = 0; r < 4; ++r) q[ks][r] = hash32(lane * 97u + ks * 7u + r) & 0x3e7f3e7fu;
  RowState st;
  st.reset();
  __syncwarp();
  const float logit_scale = logit_scale_log2(1.f);
  const long long t0 = clock64();
  for (int i = 0; i < iters; ++i) {
    if constexpr (kFp8)
      attend_e4m3_slot(st, q, slot, slot + kSlotBytes / 2, 31, logit_scale);
    else
      attend_keys<true>(st, q, SwizzledHalves{slot, 2048}, SwizzledHalves{slot + 4096, 2048}, 0, 15,
                        logit_scale);
    __syncwarp();
  }
  const long long t1 = clock64();
  float acc = st.m[0] + st.l[0];
  for (int nt = 0; nt < 16; ++nt) acc += st.o[nt][0] + st.o[nt][3];
  sink[(blockIdx.x * kWarps + warp) * 32 + lane] = acc;
  if (lane == 0) cycles[blockIdx.x * kWarps + warp] = t1 - t0;
#endif
}

template <bool kFp8, int kWarps, int kCtasPerSm> void measure(int sms, int iters) {
  const auto kernel = attend_rate_kernel<kFp8, kWarps, kCtasPerSm>;
  const int smem = 1024 + kWarps * kSlotBytes, grid = sms * kCtasPerSm;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaFuncAttributes attributes{};
  CK(cudaFuncGetAttributes(&attributes, kernel));
  int resident = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kWarps * 32, smem));
  float* sink = nullptr;
  long long* cycles = nullptr;
  CK(cudaMalloc(&sink, sizeof(float) * grid * kWarps * 32));
  CK(cudaMalloc(&cycles, sizeof(long long) * grid * kWarps));
  kernel<<<grid, kWarps * 32, smem>>>(2, sink, cycles); // warm-up (module load)
  CK(cudaGetLastError());
  cudaEvent_t start, stop;
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&stop));
  CK(cudaEventRecord(start));
  kernel<<<grid, kWarps * 32, smem>>>(iters, sink, cycles);
  CK(cudaEventRecord(stop));
  CK(cudaEventSynchronize(stop));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, start, stop));
  std::vector<long long> host(static_cast<size_t>(grid) * kWarps);
  CK(cudaMemcpy(host.data(), cycles, sizeof(long long) * host.size(), cudaMemcpyDeviceToHost));
  double mean_cycles = 0;
  for (long long c : host) mean_cycles += static_cast<double>(c) / host.size();
  const double per_stage = mean_cycles / iters;
  const double stages_per_us_sm = static_cast<double>(grid) * kWarps * iters / (ms * 1e3) / sms;
  std::printf("%-5s warps/CTA %d CTAs/SM %d (resident %d) regs %3d spill %4zu B | %7.0f cycles a "
              "stage a warp | %5.2f stages/us an SM = %5.1f GB/s an SM (copy rate ~30)\n",
              kFp8 ? "e4m3" : "bf16", kWarps, kCtasPerSm, resident, attributes.numRegs,
              attributes.localSizeBytes, per_stage, stages_per_us_sm,
              stages_per_us_sm * kSlotBytes / 1e3);
  CK(cudaFree(sink));
  CK(cudaFree(cycles));
  CK(cudaEventDestroy(start));
  CK(cudaEventDestroy(stop));
}

} // namespace

int main(int argc, char** argv) {
  int iters = 2000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) iters = std::max(10, std::atoi(argv[++i]));
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9) {
    std::fprintf(stderr, "attend_rate: needs compute capability 9.0 (sm_90a code)\n");
    return 2;
  }
  std::printf("attend_rate on %s (%d SMs), %d stages a warp\n", prop.name, prop.multiProcessorCount,
              iters);
  const int sms = prop.multiProcessorCount;
  // Today's TMA kernel: 4 warps a CTA, 2 CTAs an SM. Then more warps an SM.
  measure<false, 4, 2>(sms, iters);
  measure<false, 4, 1>(sms, iters);
  measure<false, 8, 1>(sms, iters);
  measure<false, 4, 3>(sms, iters);
  measure<false, 4, 4>(sms, iters);
  measure<false, 8, 2>(sms, iters);
  measure<true, 4, 2>(sms, iters);
  measure<true, 4, 1>(sms, iters);
  measure<true, 8, 1>(sms, iters);
  measure<true, 4, 4>(sms, iters);
  measure<true, 8, 2>(sms, iters);
  return 0;
}
