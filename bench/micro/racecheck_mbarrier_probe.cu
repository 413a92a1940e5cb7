// Does compute-sanitizer's racecheck order shared-memory accesses by an mbarrier? (s49: the pooled
// query slots of the e4m3 prefill drew write-write reports between consumers that hand a slot on
// through mbarriers only.) One CTA of 96 threads, four cases, each a write by warp 0 then a write
// of the same words by another warp:
//   0: __syncthreads between them (racecheck's own barrier: must be clean);
//   1: warp 0 arrives on an mbarrier (count 32), warp 1 waits on its phase (try_wait.parity);
//   2: a hand-off through a third warp: warp 0 arrives on `a`, warp 2 waits on `a` and arrives on
//      `b`, warp 1 waits on `b` - the prefill's release -> producer -> fill chain without the TMA;
//   3: as 1, but only lane 0 of warp 0 arrives (count 1), after a __syncwarp - the prefill's
//      slot release (the memory model orders the other lanes' writes before it: bar.warp.sync,
//      then a cumulative release).
// Build: bench/micro/build.sh racecheck_mbarrier_probe (-> .gpu/racecheck_mbarrier_probe)
// Run:   for c in 0 1 2 3; do compute-sanitizer --tool racecheck .gpu/racecheck_mbarrier_probe $c; done
// Clean in case 1 and 2: racecheck follows mbarriers; hazards: it does not (then a kernel whose
// slots change hands through mbarriers reports hazards that are no races). Measured (s49 r3 / r4,
// H100): 0, 1 and 2 clean, 3 one hazard - racecheck follows an mbarrier from each arriving
// thread only, so a release that other lanes' writes must precede has every lane arrive.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}
__device__ __forceinline__ void wait(uint64_t* bar, uint32_t parity) {
  asm volatile("{\n.reg .pred done;\nWAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra WAIT;\n}\n" ::"r"(smem_address(bar)),
               "r"(parity)
               : "memory");
}

__global__ void probe(int mode, int* out) {
  __shared__ int words[32];
  __shared__ uint64_t a, b, c;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 32;\n" ::"r"(smem_address(&a)) : "memory");
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 32;\n" ::"r"(smem_address(&b)) : "memory");
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_address(&c)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (warp == 0) words[lane] = lane;
  if (mode == 0) __syncthreads();
  if (mode == 1) {
    if (warp == 0) arrive(&a);
    if (warp == 1) wait(&a, 0);
  }
  if (mode == 2) {
    if (warp == 0) arrive(&a);
    if (warp == 2) {
      wait(&a, 0);
      arrive(&b);
    }
    if (warp == 1) wait(&b, 0);
  }
  if (mode == 3) {
    if (warp == 0) {
      __syncwarp();
      if (lane == 0) arrive(&c);
    }
    if (warp == 1) wait(&c, 0);
  }
  if (warp == 1) words[lane] += 100;
  __syncthreads();
  if (warp == 0) out[lane] = words[lane];
}

int main(int argc, char** argv) {
  const int mode = argc > 1 ? atoi(argv[1]) : 1;
  int* out = nullptr;
  if (cudaMalloc(&out, 32 * sizeof(int)) != cudaSuccess) return 2;
  probe<<<1, 96>>>(mode, out);
  int host[32];
  const cudaError_t e = cudaMemcpy(host, out, sizeof(host), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    printf("mode %d: %s\n", mode, cudaGetErrorString(e));
    return 1;
  }
  bool ok = true;
  for (int i = 0; i < 32; ++i) ok = ok && host[i] == 100 + i;
  printf("mode %d: %s\n", mode, ok ? "values ok" : "values WRONG");
  return ok ? 0 : 1;
}
