#pragma once
// Hopper (sm_90a) building blocks written as inline PTX: mbarriers, TMA tensor loads, wgmma with
// shared-memory descriptors, register reallocation and named barriers. Hand-written rather than
// CuTe: the scorer uses one MMA shape, one shared-memory layout (K-major, 128-byte swizzle) and
// one copy, and these ~150 lines say exactly which instructions run, with no template machinery
// to compile on CI's two cores. Everything here is only meaningful where __CUDA_ARCH_FEAT_SM90_ALL
// is defined (the sm_90a pass); callers guard their kernel bodies with it.
//
// Shared-memory layout of every wgmma operand here ("K-major, 128 B swizzle"): rows of 128 bytes
// (64 bf16 or 128 e4m3 of the reduction dimension); the 16-byte chunk c of row r sits at
// r * 128 + ((c ^ (r % 8)) * 16) from a 1024-byte-aligned base. TMA's CU_TENSOR_MAP_SWIZZLE_128B
// writes exactly this, and store_swizzled_chunk() writes it from registers.
#include <cstdint>

namespace m3sa::cuda::sm90 {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The first 1024-byte boundary (a swizzle atom) at or after `p`, in shared memory: dynamic shared
// memory is only 16-byte aligned, so a kernel asks for 1 KB more and starts its operands here.
__device__ __forceinline__ uint8_t* align_to_swizzle_atom(uint8_t* p) {
  return p + ((1024 - (shared_address(p) & 1023)) & 1023);
}

// Byte offset of chunk `chunk` (16 B) of row `row` in a 128 B-swizzled operand.
__device__ __forceinline__ uint32_t swizzled_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// ---- mbarriers -------------------------------------------------------------------------------

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(bar)),
               "r"(arrivals));
}
// Makes the initialised barriers visible to the async proxy (TMA) before first use.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_address(bar)) : "memory");
}
// Arrives and tells the barrier `bytes` more will land (TMA's complete_tx counts them down).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile(
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(bar)),
      "r"(bytes)
      : "memory");
}
// Waits until the phase of parity `parity` has completed. A fresh barrier is in phase 0, so
// waiting for parity 1 returns at once: producers start their waits on "empty" at parity 1.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile("{\n"
               ".reg .pred done;\n"
               "WAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra WAIT;\n"
               "}\n" ::"r"(shared_address(bar)),
               "r"(parity)
               : "memory");
}

// The same for a phase completed by other CTAs of the cluster (st.async's complete_tx): acquire at
// cluster scope, so that their bytes are visible to this thread.
__device__ __forceinline__ void mbarrier_wait_cluster(uint64_t* bar, uint32_t parity) {
  asm volatile("{\n"
               ".reg .pred done;\n"
               "WAIT:\n"
               "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra WAIT;\n"
               "}\n" ::"r"(shared_address(bar)),
               "r"(parity)
               : "memory");
}

// ---- clusters: barriers and pushes into a peer CTA's shared memory ----------------------------
//
// Why not cooperative_groups' cluster.sync(): its release / acquire at cluster scope compiles to
// MEMBAR.ALL.GPU + CCTL.IVALL around the barrier (so does fence.acq_rel.cluster), a wait for
// every outstanding global access of the thread. A push by st.async needs no fence: the bytes
// count down the receiver's mbarrier, whose phase completing makes them visible there.

// Arrive on the cluster barrier, this thread's earlier accesses ordered before the peers' later
// ones (pair with cluster_wait). Costs a MEMBAR.ALL.GPU: where it is paid, nothing is in flight.
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}
// The shared::cluster address of `p` (this CTA's shared memory) in the CTA of rank `rank`.
__device__ __forceinline__ uint32_t peer_shared_address(const void* p, uint32_t rank) {
  uint32_t address;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(address)
               : "r"(shared_address(p)), "r"(rank));
  return address;
}
// 16 (8) bytes from registers into peer shared memory at `address`; they count down the peer's
// mbarrier at `bar` (both from peer_shared_address).
__device__ __forceinline__ void push_to_peer(uint32_t address, float4 v, uint32_t bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, "
      "[%5];\n" ::"r"(address),
      "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void push_to_peer(uint32_t address, float2 v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, "
               "[%3];\n" ::"r"(address),
               "f"(v.x), "f"(v.y), "r"(bar)
               : "memory");
}

// Two 8-byte keys (16 bytes) the same way, bit for bit.
__device__ __forceinline__ void push_keys_to_peer(uint32_t address, uint64_t first, uint64_t second,
                                                  uint32_t bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, "
      "[%5];\n" ::"r"(address),
      "r"(static_cast<uint32_t>(first)), "r"(static_cast<uint32_t>(first >> 32)),
      "r"(static_cast<uint32_t>(second)), "r"(static_cast<uint32_t>(second >> 32)), "r"(bar)
      : "memory");
}
// CTAs in this CTA's cluster (1: launched without clusters).
__device__ __forceinline__ uint32_t cluster_ranks() {
  uint32_t ranks;
  asm("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(ranks));
  return ranks;
}

// ---- TMA -------------------------------------------------------------------------------------

__device__ __forceinline__ void prefetch_tensor_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// One box of a 3D tensor map at coordinates (c0, c1, c2) (innermost first) into shared memory;
// its bytes complete_tx on `bar`.
__device__ __forceinline__ void tma_load_3d(void* dst, const void* map, uint64_t* bar, int c0,
                                            int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(shared_address(dst)),
               "l"(reinterpret_cast<uint64_t>(map)), "r"(shared_address(bar)), "r"(c0), "r"(c1),
               "r"(c2)
               : "memory");
}

// The same with an L2 eviction policy (l2_evict_first_policy).
__device__ __forceinline__ void tma_load_3d(void* dst, const void* map, uint64_t* bar, int c0,
                                            int c1, int c2, uint64_t policy) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
               ".L2::cache_hint [%0], [%1, {%3, %4, %5}], [%2], %6;\n" ::"r"(shared_address(dst)),
               "l"(reinterpret_cast<uint64_t>(map)), "r"(shared_address(bar)), "r"(c0), "r"(c1),
               "r"(c2), "l"(policy)
               : "memory");
}

// The same for a 4D tensor map at (c0, c1, c2, c3), into the CTA's own shared memory (.shared::cta:
// also what a CTA of a cluster means by its local addresses).
__device__ __forceinline__ void tma_load_4d(void* dst, const void* map, uint64_t* bar, int c0,
                                            int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cta.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(shared_address(dst)),
               "l"(reinterpret_cast<uint64_t>(map)), "r"(shared_address(bar)), "r"(c0), "r"(c1),
               "r"(c2), "r"(c3)
               : "memory");
}

// The same with an L2 eviction policy (l2_evict_first_policy).
__device__ __forceinline__ void tma_load_4d(void* dst, const void* map, uint64_t* bar, int c0,
                                            int c1, int c2, int c3, uint64_t policy) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cta.global.mbarrier::complete_tx::bytes"
               ".L2::cache_hint [%0], [%1, {%3, %4, %5, %6}], [%2], %7;\n"
               ::"r"(shared_address(dst)), "l"(reinterpret_cast<uint64_t>(map)),
               "r"(shared_address(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "l"(policy)
               : "memory");
}

// One box from shared memory at `src` to a 3D tensor map at (c0, c1, c2), as a bulk group of
// this thread (bulk_commit_group / bulk_wait_group_read), with an L2 eviction policy
// (l2_evict_first_policy: the prefill's partials are read only after the whole pass, and should
// not displace what is read again soon).
__device__ __forceinline__ void tma_store_3d(const void* map, const void* src, int c0, int c1,
                                             int c2, uint64_t policy) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group.L2::cache_hint"
               " [%0, {%2, %3, %4}], [%1], %5;\n" ::"l"(reinterpret_cast<uint64_t>(map)),
               "r"(shared_address(src)), "r"(c0), "r"(c1), "r"(c2), "l"(policy)
               : "memory");
}
// An L2 policy for the cache-hinted copies: evict these lines first.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until this thread's bulk groups have read their shared-memory sources (it may be
// rewritten then; the global writes may still be in flight).
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

// Orders this thread's generic-proxy shared-memory writes before later async-proxy reads
// (wgmma reads its operands through the async proxy).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- warp specialisation ---------------------------------------------------------------------

// setmaxnreg takes a multiple of 8 in [24, 256].
template <int Registers>
inline constexpr bool kValidRegisterCount =
    Registers >= 24 && Registers <= 256 && Registers % 8 == 0;
template <int Registers> __device__ __forceinline__ void release_registers() {
  static_assert(kValidRegisterCount<Registers>, "setmaxnreg: a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Registers));
}
template <int Registers> __device__ __forceinline__ void claim_registers() {
  static_assert(kValidRegisterCount<Registers>, "setmaxnreg: a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Registers));
}
// bar.sync on a named barrier (id 1..15; 0 is __syncthreads) among `threads` threads.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives at named barrier `id` (of `threads` in all) without waiting: the producer side of a
// barrier that other warps bar.sync on.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- wgmma -----------------------------------------------------------------------------------

// Descriptor of a 128 B-swizzled operand starting at shared byte address `address`: start
// address >> 4 in bits 0-13, leading byte offset >> 4 in bits 16-29, stride byte offset 1024 B
// (8 rows x 128 B, the step between 8-row groups) in bits 32-45, swizzle mode 128 B (1) in bits
// 62-63. K-major (the default): a 1024-aligned atom base plus a k offset of a multiple of 32 B
// within the 128 B row; the leading byte offset is unused (16). MN-major (a transposed B, wgmma's
// tnsp flag): rows of 64 16-bit elements along N, consecutive rows the k index; the leading byte
// offset is the step between 64-element column blocks.
__device__ __forceinline__ uint64_t operand_descriptor(uint32_t address,
                                                       uint32_t leading_bytes = 16) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>(leading_bytes >> 4) << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

// The descriptor of the operand `bytes` (a multiple of 16) past the one `descriptor` describes,
// within the same shared-memory window: one add to the address field (bits 0-13, address / 16),
// which cannot carry out of it while the address stays below 2^18, as every shared address
// does; the per-wgmma masking and shifting of operand_descriptor was ~5 % of the prefill
// consumers' instructions (bench/NOTES.md s48).
__device__ __forceinline__ uint64_t advance_descriptor(uint64_t descriptor, uint32_t bytes) {
  return descriptor + (bytes >> 4);
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most kPending of this warpgroup's committed wgmma groups are pending (groups
// complete in commit order).
template <int kPending> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void wgmma_wait_all() { wgmma_wait<0>(); }
// Keeps the compiler from moving accumulator reads or writes across a wgmma fence / wait.
__device__ __forceinline__ void fence_accumulators(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The 64 fp32 accumulators of an m64n128 wgmma, as the asm's operand list (%0 .. %63) and its
// read-write register constraints; the A and B descriptors are %64 and %65, the accumulate flag
// %66.
#define M3SA_WGMMA_D64_LIST                                                                        \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "    \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "     \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "     \
  "%56, %57, %58, %59, %60, %61, %62, %63}"
#define M3SA_WGMMA_D64_OUTPUTS(d)                                                                  \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),     \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),   \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),   \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),   \
      "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),   \
      "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),   \
      "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),   \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// D (64 x 128, fp32, the m64nNk16 register layout: thread t of the warpgroup holds rows
// 16 (t / 32) + (t % 32) / 4 (+ 8), columns 8 i + 2 (t % 4) (+ 1) as d[4 i + {0, 1, 2, 3}])
// (+)= A (64 x K) . B (128 x K)^T, both K-major in shared memory. accumulate == 0 overwrites D.
__device__ __forceinline__ void wgmma_m64n128k16_bf16(float (&d)[64], uint64_t desc_a,
                                                      uint64_t desc_b, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " M3SA_WGMMA_D64_LIST
               ", %64, %65, p, 1, 1, 0, 0;\n}\n"
               : M3SA_WGMMA_D64_OUTPUTS(d)
               : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// D (+)= A (64 x 16 in registers: the m64k16 fragment, per warp mma.sync's m16k16 A layout) . B,
// B in shared memory; both operands bf16 (kHalf: fp16). TRANSPOSE_B "1": B (16 x 128) MN-major
// (consecutive elements run along N); "0": B (128 x 16)^T, K-major.
#define M3SA_WGMMA_RS(TYPE, TRANSPOSE_B)                                                           \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                        \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE                        \
               " " M3SA_WGMMA_D64_LIST ", {%64, %65, %66, %67}, %68, p, 1, 1, " TRANSPOSE_B        \
               ";\n}\n"                                                                            \
               : M3SA_WGMMA_D64_OUTPUTS(d)                                                         \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))
template <bool kHalf = false>
__device__ __forceinline__ void wgmma_m64n128k16_rs_mn_major_b(float (&d)[64],
                                                               const uint32_t (&a)[4],
                                                               uint64_t desc_b, int accumulate) {
  if constexpr (kHalf)
    M3SA_WGMMA_RS("f16", "1");
  else
    M3SA_WGMMA_RS("bf16", "1");
}
template <bool kHalf = false>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4],
                                                    uint64_t desc_b, int accumulate) {
  if constexpr (kHalf)
    M3SA_WGMMA_RS("f16", "0");
  else
    M3SA_WGMMA_RS("bf16", "0");
}
#undef M3SA_WGMMA_RS

// The m16k16 A fragment of rows row0 .. row0 + 15, 16-byte chunks `chunk` and `chunk` + 1 of a
// 128 B-swizzled operand at shared address `operand`: lane l addresses row row0 + (l / 8 % 2) * 8
// + l % 8, chunk `chunk` + l / 16, so a[0..3] come out in the m16 A order (rows 0-7 / 8-15, then
// the k half).
__device__ __forceinline__ void load_a_fragment(uint32_t (&a)[4], uint32_t operand, int row0,
                                                int chunk, int lane) {
  const int row = row0 + ((lane >> 3) & 1) * 8 + (lane & 7);
  const uint32_t address = operand + swizzled_offset(row, chunk + (lane >> 4));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(address));
}

// Keeps the compiler from moving writes of wgmma's register A fragments past the fence before
// the wgmmas that read them, or reuse of those registers before the wait after them.
template <int kSteps> __device__ __forceinline__ void fence_fragments(uint32_t (&a)[kSteps][4]) {
#pragma unroll
  for (int j = 0; j < kSteps; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[j][i])::"memory");
}

// As wgmma_m64n128k16_bf16 for e4m3 operands, K = 32 a step (32 bytes of the 128-byte row; e4m3
// wgmma takes no transpose flags: both operands K-major). Accumulates like Hopper's e4m3 tensor
// cores, not exactly in fp32 (bench/micro/qgmma_error.cu measures by how much).
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t desc_a,
                                                      uint64_t desc_b, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " M3SA_WGMMA_D64_LIST
               ", %64, %65, p, 1, 1;\n}\n"
               : M3SA_WGMMA_D64_OUTPUTS(d)
               : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

} // namespace m3sa::cuda::sm90
