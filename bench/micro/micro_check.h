#pragma once
// What the microbenchmarks (attend_rate, qgmma_error, wgmma_rate, launch_cost) share: a CUDA call
// check that ends the program, and a 32-bit integer hash for deterministic data.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define CK(expr)                                                                                   \
  do {                                                                                             \
    const cudaError_t e_ = (expr);                                                                 \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_));   \
      std::exit(2);                                                                                \
    }                                                                                              \
  } while (0)

__device__ inline uint32_t hash32(uint32_t x) {
  x ^= x >> 16, x *= 0x7feb352dU, x ^= x >> 15, x *= 0x846ca68bU, x ^= x >> 16;
  return x;
}
