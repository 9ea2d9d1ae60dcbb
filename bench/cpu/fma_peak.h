#pragma once
// fp32 FMA peak micro-benchmarks: every OpenMP thread runs independent FMA chains (more chains than FMA latency x
// ports, so the pipes never wait), one file per instruction set; the caller picks the widest this CPU runs.
#include <cstdint>

// Each returns the floating-point operations done (2 per FMA lane) by all threads in `iters` iterations.
double fma_peak_avx512_flops(int64_t iters);
double fma_peak_avx2_flops(int64_t iters);
double fma_peak_portable_flops(int64_t iters);
