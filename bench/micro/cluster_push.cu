// cluster_push: a minimal repro of the decode attention's cluster merge, to ask whether
// compute-sanitizer's synccheck runs thread-block clusters of 16 CTAs (bench/NOTES.md s25 r4-r5,
// s26 r1: two attention cases with 16-CTA clusters fail only under synccheck; capped at 8 they
// pass).
//
// The same protocol as merge_splits_in_cluster (sparse_attention_decode.cuh), with m3sa's own PTX
// helpers (sm90/hopper.cuh): every CTA initialises an mbarrier, arrives on the cluster barrier
// (release) and waits on it once; then each CTA pushes one 16-byte value per owned row into the
// shared memory of the row's owner (rank row % cluster) by st.async, counted down the owner's
// mbarrier; owners wait for their bytes, sum the slots and write the rows; CTAs that own no row
// exit right after their pushes. `rows` < cluster leaves most CTAs without a row, as GQA groups 2
// and 4 do in the failing cases.
//
// Usage: .gpu/cluster_push <cluster 2..16> <clusters> <rows 1..16> [smem KB]
// Exit 0: every output equals the host's sum; 3: a wrong value; 2: a CUDA error.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/kernels/sm90/hopper.cuh"

using namespace m3sa::cuda;

#define CK(call)                                                                                   \
  do {                                                                                             \
    const cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__,       \
                   __LINE__, #call);                                                               \
      std::exit(2);                                                                                \
    }                                                                                              \
  } while (0)

constexpr int kMaxRows = 16;
constexpr int kThreads = 128;

// out: [clusters, rows] floats, the sum over the cluster's ranks of value(rank, row).
__device__ __host__ inline float value_of(int cluster_id, int rank, int row) {
  return static_cast<float>(cluster_id * 1000 + rank * 16 + row);
}

__global__ void __launch_bounds__(kThreads) cluster_push_kernel(float* out, int rows) {
  extern __shared__ __align__(16) unsigned char smem[]; // the receiving slots (and padding)
  __shared__ uint64_t bar;
  uint32_t rank = 0, size = 1;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(size));
  const int cluster_id = static_cast<int>(blockIdx.x / size);
  float4* receive = reinterpret_cast<float4*>(smem); // [row slot][rank]
  const int owned = rank < static_cast<uint32_t>(rows) ? (rows - rank + size - 1) / size : 0;
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(&bar, 1);
    sm90::fence_barrier_init();
  }
  __syncthreads();
  sm90::cluster_arrive_release();
  if (threadIdx.x == 0) sm90::mbarrier_arrive_expect_tx(&bar, owned * size * 16);
  sm90::cluster_wait();
  if (threadIdx.x < rows) { // push row r's value to its owner's slot (r / size) * size + rank
    const int row = threadIdx.x;
    const uint32_t owner = row % size;
    const int slot = row / size * size + rank;
    const float v = value_of(cluster_id, rank, row);
    sm90::push_to_peer(sm90::peer_shared_address(receive + slot, owner), make_float4(v, v, v, v),
                       sm90::peer_shared_address(&bar, owner));
  }
  if (owned == 0) return;
  sm90::mbarrier_wait(&bar, 0);
  if (threadIdx.x < owned) {
    const int row = rank + threadIdx.x * size;
    float sum = 0.f;
    for (uint32_t s = 0; s < size; ++s) sum += receive[threadIdx.x * size + s].x;
    out[cluster_id * rows + row] = sum;
  }
}

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s <cluster 2..16> <clusters> <rows 1..16> [smem KB]\n", argv[0]);
    return 2;
  }
  const int cluster = std::atoi(argv[1]), clusters = std::atoi(argv[2]), rows = std::atoi(argv[3]);
  const int smem = (argc > 4 ? std::atoi(argv[4]) : 64) * 1024;
  if (cluster < 2 || cluster > 16 || clusters < 1 || rows < 1 || rows > kMaxRows ||
      smem < kMaxRows * 16 * 16) {
    std::fprintf(stderr, "bad arguments\n");
    return 2;
  }
  float* out = nullptr;
  CK(cudaMalloc(&out, sizeof(float) * clusters * rows));
  CK(cudaMemset(out, 0xff, sizeof(float) * clusters * rows)); // NaN: a row never written fails
  CK(cudaFuncSetAttribute(cluster_push_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  if (cluster > 8)
    CK(cudaFuncSetAttribute(cluster_push_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed,
                            1));
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(cluster * clusters);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = cluster;
  attribute.val.clusterDim.y = attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  int active = 0;
  CK(cudaOccupancyMaxActiveClusters(&active, cluster_push_kernel, &config));
  CK(cudaLaunchKernelEx(&config, cluster_push_kernel, out, rows));
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> host(clusters * rows);
  CK(cudaMemcpy(host.data(), out, sizeof(float) * host.size(), cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int c = 0; c < clusters; ++c)
    for (int r = 0; r < rows; ++r) {
      float expected = 0.f;
      for (int k = 0; k < cluster; ++k) expected += value_of(c, k, r);
      wrong += host[c * rows + r] != expected;
    }
  std::printf("cluster %d x %d clusters (%d held at once), %d rows, %d KB smem: %d of %d wrong\n",
              cluster, clusters, active, rows, smem / 1024, wrong, clusters * rows);
  CK(cudaFree(out));
  return wrong ? 3 : 0;
}
