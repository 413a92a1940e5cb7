#pragma once
// Functions compiled for both the host and the device: __host__ __device__ under nvcc, inline for
// the host compiler (so plain C++ - the CPU backend, the CPU tests - can call and test them).
#if defined(__CUDACC__)
#define M3SA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define M3SA_HOST_DEVICE inline
#endif
// A loop that the device code must unroll (an array indexed by the loop counter stays in
// registers only then); host code, nvcc's host pass included, leaves it to the compiler (the host
// compilers' pragmas differ, and -Wall flags the foreign ones).
#if defined(__CUDA_ARCH__)
#define M3SA_UNROLL _Pragma("unroll")
#else
#define M3SA_UNROLL
#endif
