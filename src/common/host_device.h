#pragma once
// FL_HD: a small function compiled for host and device under nvcc, a plain inline function elsewhere (the CPU build).
#if defined(__CUDACC__)
#define FL_HD __host__ __device__ __forceinline__
#else
#define FL_HD inline
#endif
