// The sustained rate of the SM90 scorer's MMA shape, with and without its epilogue: what bounds
// score_blocks_sm90 (bench/NOTES.md s20 r2). The scorer's stamps put each consumer's cycle at
// ~3,260 cycles a page whatever the arrangement (s19 r2 ping-pong, s20 r1 tile pipeline), against
// 2 x 1,024 tensor cycles for the two consumers' MMAs: either the epilogue or the MMA shape itself
// (m64n128k16 from shared memory, K = 128 then a full wait) sets that cycle.
//
// Each CTA (one per SM, 384 threads as the scorer: warpgroup 0 idle, warpgroups 1-2 consumers)
// fills 64 KB of queries and 128 KB of keys in shared memory once, then each consumer runs
// `pages` steps over the resident stages (no producer, no page waits), each step as the scorer's:
// 128 query rows x 128 keys x 128 dims, then a full wgmma wait, then the epilogue:
//   form ss128: two m64n128k16 tiles, A and B from shared memory (the scorer today);
//   form rs128: the same with A (the queries, fixed for a work unit) held in registers;
//   form ss256: one m64n256k16 tile over two pages (a consumer's 64 rows x 256 keys).
//   epilogue none: one value of each tile folded (keeps ptxas from dropping the MMAs);
//   epilogue maxima: the scorer's own block maxima (unmasked_block_maxima and
//     combine_quad_maxima of score_blocks_sm90.cuh: 4 rows x 32 values a thread, 16 FMNMX chains,
//     two shuffle rounds; s20 r2 ran a copy of the same chains) and a strided store a row and
//     block, as the scorer;
//   epilogue maxima_nostore: the maxima folded into a register instead of stored.
// Printed per variant: time, TFLOP/s (2 x 128 x 128 x 128 a consumer step), the median consumer's
// cycles a step (clock64; 1,024 x consumers when the tensor pipes never idle) and the SM clock
// that implies. s20 r2 (before the median and the clock were printed: a mean, one of them
// garbage): the two-consumer steps ran at 2,048-2,111 cycles, the pipes saturated with or without
// the epilogue, and the wall-clock differences were the clock's.
//
// Build: bench/micro/build.sh wgmma_rate (-> .gpu/wgmma_rate). Run: .gpu/wgmma_rate [pages]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/kernels/score_blocks_sm90.cuh"
#include "cuda/kernels/sm90/hopper.cuh"

#include "micro_check.h"

namespace {

using namespace m3sa::cuda;

constexpr int kQueryBytes = 2 * 256 * 128;   // [slab][256 rows][128 B]
constexpr int kKeyBytes = 4 * 2 * 128 * 128; // [stage][slab][128 keys][128 B] (ss256: 2 x 256 keys)
constexpr int kSmemBytes = 1024 + kQueryBytes + kKeyBytes;
enum Form { kSs128, kRs128, kSs256 };
enum Epilogue { kNone, kMaxima, kMaximaNoStore };

// D (64 x 256 fp32) (+)= A (64 x 16) . B (256 x 16)^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n256k16_bf16(float (&d)[128], uint64_t desc_a,
                                                      uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
      "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, "
      "%63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, "
      "%81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, "
      "%99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, "
      "%114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, "
      "%129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
        "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
        "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
        "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
        "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),
        "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
        "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),
        "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),
        "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

template <Form kForm, Epilogue kEpilogue, int kConsumers>
__global__ void __launch_bounds__(384, 1)
    wgmma_rate_kernel(int pages, float* out, long long* cycles) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = sm90::align_to_swizzle_atom(smem_raw);
  uint8_t* query_s = smem;
  uint8_t* key_s = smem + kQueryBytes;
  // Finite bf16 values in [-1, 1): sign, exponent 120..126, random mantissa.
  for (int i = threadIdx.x; i < (kQueryBytes + kKeyBytes) / 4; i += blockDim.x) {
    const uint32_t h = hash32(i * 2654435761u + blockIdx.x);
    const uint32_t lo = (h & 0x807f) | ((120 + (h >> 8) % 7) << 7);
    const uint32_t hi = ((h >> 16) & 0x807f) | ((120 + (h >> 24) % 7) << 7);
    reinterpret_cast<uint32_t*>(smem)[i] = lo | hi << 16;
  }
  sm90::fence_proxy_async_shared();
  __syncthreads();
  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0 || warpgroup > kConsumers) {
    sm90::release_registers<56>();
    return;
  }
  sm90::claim_registers<224>();
  const int consumer = warpgroup - 1, thread = threadIdx.x - 128 * warpgroup;
  const int lane = thread % 32, warp = thread / 32;
  float acc[2][64];
  float sink = 0.f;
  uint32_t a[2][8][4]; // rs128: the consumer's query rows, m64k16 fragments a tile and k step
  if constexpr (kForm == kRs128) {
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int k = 0; k < 8; ++k)
#pragma unroll
        for (int r = 0; r < 4; ++r) // any bits of the tile's rows: the rate does not depend on them
          a[t][k][r] = reinterpret_cast<const uint32_t*>(
              query_s)[(consumer * 128 + 64 * t + 16 * warp + lane / 4 + 8 * (r % 2)) * 32 +
                       (k * 8 + 2 * (lane % 4) + 8 * (r / 2)) % 32];
  }
  float* out_row = out + (static_cast<size_t>(blockIdx.x) * 256 + consumer * 128 + thread) * 512;
  const long long start = clock64();
  for (int it = 0; it < pages; ++it) {
    const uint32_t query_base = sm90::shared_address(query_s);
#pragma unroll
    for (int t = 0; t < 2; ++t) sm90::fence_accumulators(acc[t]);
    if constexpr (kForm == kRs128) sm90::fence_fragments<8>(a[0]), sm90::fence_fragments<8>(a[1]);
    sm90::wgmma_fence();
    if constexpr (kForm == kSs256) {
      const uint32_t key_base = sm90::shared_address(key_s) + (it & 1) * (2 * 256 * 128);
      float(&d)[128] = *reinterpret_cast<float(*)[128]>(&acc[0][0]);
#pragma unroll
      for (int slab = 0; slab < 2; ++slab)
#pragma unroll
        for (int k = 0; k < 4; ++k)
          wgmma_m64n256k16_bf16(d,
                                sm90::operand_descriptor(query_base + slab * (256 * 128) +
                                                         consumer * 64 * 128 + k * 32),
                                sm90::operand_descriptor(key_base + slab * (256 * 128) + k * 32),
                                slab + k);
    } else {
      const uint32_t key_base = sm90::shared_address(key_s) + (it & 3) * (2 * 128 * 128);
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int slab = 0; slab < 2; ++slab)
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const uint64_t b = sm90::operand_descriptor(key_base + slab * (128 * 128) + k * 32);
            if constexpr (kForm == kRs128)
              sm90::wgmma_m64n128k16_rs(acc[t], a[t][slab * 4 + k], b, slab + k);
            else
              sm90::wgmma_m64n128k16_bf16(acc[t],
                                          sm90::operand_descriptor(query_base + slab * (256 * 128) +
                                                                   (consumer * 128 + t * 64) * 128 +
                                                                   k * 32),
                                          b, slab + k);
          }
    }
    sm90::wgmma_commit_group();
    sm90::wgmma_wait_all();
#pragma unroll
    for (int t = 0; t < 2; ++t) sm90::fence_accumulators(acc[t]);
    if constexpr (kEpilogue == kNone) {
      sink +=
          acc[0][0] + acc[1][63]; // both tiles live (a dynamic index would put acc in local memory)
    } else {
      // The scorer's own epilogue (score_blocks_sm90.cuh). ss256: acc[0] holds the rows' columns
      // 0-127 (block 0), acc[1] columns 128-255 (block 1), in the same per-row layout.
      float m[4];
      unmasked_block_maxima(acc, m);
      combine_quad_maxima(m);
      if constexpr (kEpilogue == kMaxima) {
        if (lane % 4 == 0) // four rows a quad leader, 512 floats apart (the scorer's token stride)
#pragma unroll
          for (int r = 0; r < 4; ++r) out_row[r * 8 * 512 + (it & 511)] = m[r] * 0.125f;
      } else {
        sink += m[0] + m[1] + m[2] + m[3];
      }
    }
  }
  const long long stop = clock64();
  if (thread == 0) cycles[blockIdx.x * 2 + consumer] = stop - start;
  if (sink == 12345.f) out[0] = sink; // never true: keeps the folds alive
#endif
}

template <Form kForm, Epilogue kEpilogue, int kConsumers>
void run(const char* name, int pages, int sms, float* out, long long* cycles_d) {
  auto kernel = wgmma_rate_kernel<kForm, kEpilogue, kConsumers>;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  cudaEvent_t begin, end;
  CK(cudaEventCreate(&begin));
  CK(cudaEventCreate(&end));
  kernel<<<sms, 384, kSmemBytes>>>(pages, out, cycles_d);
  CK(cudaGetLastError());
  float best = 1e30f, last = 0.f;
  for (int rep = 0; rep < 5; ++rep) {
    CK(cudaEventRecord(begin));
    kernel<<<sms, 384, kSmemBytes>>>(pages, out, cycles_d);
    CK(cudaEventRecord(end));
    CK(cudaEventSynchronize(end));
    CK(cudaEventElapsedTime(&last, begin, end));
    best = last < best ? last : best;
  }
  // The last launch's clock64 spans, a consumer each: their median in cycles a step, and the SM
  // clock they imply over the last launch's time (the clock falls as the tensor pipes get busier).
  std::vector<long long> cycles(2 * sms);
  CK(cudaMemcpy(cycles.data(), cycles_d, sizeof(long long) * 2 * sms, cudaMemcpyDeviceToHost));
  std::vector<long long> spans;
  for (int i = 0; i < sms; ++i)
    for (int c = 0; c < kConsumers; ++c) spans.push_back(cycles[2 * i + c]);
  std::nth_element(spans.begin(), spans.begin() + spans.size() / 2, spans.end());
  const double median = static_cast<double>(spans[spans.size() / 2]);
  const double flops = 2.0 * 128 * 128 * 128 * pages * kConsumers * sms;
  std::printf("%-24s %9.1f us %7.1f TFLOP/s %6.0f cycles a step and consumer (peak: 1,024 x %d) "
              "at %.2f GHz\n",
              name, best * 1e3, flops / (best * 1e-3) / 1e12, median / pages, kConsumers,
              median / (last * 1e6));
  CK(cudaEventDestroy(begin));
  CK(cudaEventDestroy(end));
}

} // namespace

int main(int argc, char** argv) {
  const int pages = argc > 1 ? std::atoi(argv[1]) : 4096;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float* out;
  long long* cycles;
  CK(cudaMalloc(&out, sizeof(float) * sms * 256 * 512));
  CK(cudaMalloc(&cycles, sizeof(long long) * 2 * sms));
  std::printf("wgmma_rate: %d SMs, %d steps a consumer\n", sms, pages);
  run<kSs128, kNone, 2>("ss128 none x2", pages, sms, out, cycles);
  run<kSs128, kMaxima, 2>("ss128 maxima x2", pages, sms, out, cycles);
  run<kSs128, kMaximaNoStore, 2>("ss128 maxima_nostore x2", pages, sms, out, cycles);
  run<kSs128, kNone, 1>("ss128 none x1", pages, sms, out, cycles);
  run<kSs128, kMaxima, 1>("ss128 maxima x1", pages, sms, out, cycles);
  run<kRs128, kNone, 2>("rs128 none x2", pages, sms, out, cycles);
  run<kRs128, kMaxima, 2>("rs128 maxima x2", pages, sms, out, cycles);
  run<kRs128, kNone, 1>("rs128 none x1", pages, sms, out, cycles);
  run<kSs256, kNone, 2>("ss256 none x2", pages, sms, out, cycles);
  run<kSs256, kMaxima, 2>("ss256 maxima x2", pages, sms, out, cycles);
  run<kSs256, kNone, 1>("ss256 none x1", pages, sms, out, cycles);
  CK(cudaFree(out));
  CK(cudaFree(cycles));
  return 0;
}
