#pragma once
// Functions compiled for both the host and the device: __host__ __device__ under nvcc, inline for
// the host compiler (so plain C++ - the CPU backend, the CPU tests - can call and test them).
#if defined(__CUDACC__)
#define M3SA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define M3SA_HOST_DEVICE inline
#endif
