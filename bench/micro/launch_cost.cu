// Host cost of what a launch of m3sa's does before the kernel runs (launch_with_shared_memory in
// src/cuda/kernels/common.cuh): cudaFuncSetAttribute for the dynamic shared memory (and the
// non-portable cluster size above 8 CTAs) on every launch, then cudaLaunchKernelEx with a
// cluster and programmatic dependent launch. Times each part over many calls on an empty kernel
// with the decode attention's launch shape (batch 1, 64/4: 64 CTAs in clusters of 16, 128
// threads, 100 KB of dynamic shared memory), so that the attributes' share of a B=1 decode
// call's ~5.5 us of host time (bench/python_overhead.py, cpp_host_us) is known.
//   bash bench/micro/build.sh launch_cost && .gpu/launch_cost (or nvcc -arch=sm_90a on the device)
#include <chrono>
#include <cstdio>

#include "micro_check.h"

__global__ void empty_kernel(int) {}

template <typename F> double host_us(int calls, F&& f) {
  for (int i = 0; i < 100; ++i) f();
  CK(cudaDeviceSynchronize());
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) f();
  const auto end = std::chrono::steady_clock::now();
  CK(cudaDeviceSynchronize());
  return std::chrono::duration<double, std::micro>(end - start).count() / calls;
}

int main() {
  constexpr int kSmem = 100 * 1024, kCluster = 16, kCalls = 20000;
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CK(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  CK(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(64);
  config.blockDim = dim3(128);
  config.dynamicSmemBytes = kSmem;
  config.stream = stream;
  cudaLaunchAttribute attributes[2] = {};
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = kCluster;
  attributes[0].val.clusterDim.y = attributes[0].val.clusterDim.z = 1;
  attributes[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[1].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attributes;
  config.numAttrs = 2;
  const auto set_smem = [] {
    CK(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  };
  const auto set_cluster = [] {
    CK(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  };
  const auto launch = [&] { CK(cudaLaunchKernelEx(&config, empty_kernel, 0)); };
  int device = 0;
  const double smem_us = host_us(kCalls, set_smem);
  const double cluster_us = host_us(kCalls, set_cluster);
  const double get_device_us = host_us(kCalls, [&] { CK(cudaGetDevice(&device)); });
  const double launch_us = host_us(kCalls, launch);
  const double both_us = host_us(kCalls, [&] {
    set_smem();
    set_cluster();
    launch();
  });
  std::printf("host us a call (%d calls): cudaFuncSetAttribute(max dynamic smem) %.3f, "
              "(non-portable cluster) %.3f, cudaGetDevice %.3f, cudaLaunchKernelEx (64 CTAs, "
              "clusters of 16, PDL) %.3f, attributes + launch %.3f\n",
              kCalls, smem_us, cluster_us, get_device_us, launch_us, both_us);
  return 0;
}
