// The tiled kernel's hot loops for any CPU: GCC/Clang vector extensions of 4 floats, which the compiler maps to the
// baseline target's registers (SSE2 on x86-64, NEON on arm64). A 4 x 8 register block.
#include <cstring>

#include "common/half.h"
#include "cpu/tiled_simd.h"

namespace flashlite::cpu_tiled {
namespace {

struct Portable {
  typedef float reg __attribute__((vector_size(16)));
  typedef int32_t ireg __attribute__((vector_size(16)));
  static constexpr int width = 4, mr = 4, nv = 2;
  static reg zero() { return reg{}; }
  static reg set1(float x) { return reg{} + x; }
  static reg load(const float* p) {
    reg r;
    std::memcpy(&r, p, sizeof r);
    return r;
  }
  static void store(float* p, reg x) { std::memcpy(p, &x, sizeof x); }
  static reg add(reg a, reg b) { return a + b; }
  static reg sub(reg a, reg b) { return a - b; }
  static reg mul(reg a, reg b) { return a * b; }
  static reg fma(reg a, reg b, reg c) { return a * b + c; }
  static reg max(reg a, reg b) { return a > b ? a : b; }
  static reg min(reg a, reg b) { return a < b ? a : b; }
  static reg div(reg a, reg b) { return a / b; }
  static reg select_lt(reg x, reg t, reg a, reg b) { return x < t ? a : b; }
  static reg round(reg x) {  // nearest, ties to even, for |x| < 2^22 (the callers clamp to [-127, 64])
    const reg magic = set1(12582912.0f);  // 1.5 * 2^23
    return (x + magic) - magic;
  }
  static reg pow2i(reg n) { return reg((__builtin_convertvector(n, ireg) + 127) << 23); }
  static reg load_f16(const uint16_t* p) {
    reg r;
    for (int i = 0; i < width; ++i) r[i] = fp16_to_float(p[i]);
    return r;
  }
  static reg load_bf16(const uint16_t* p) {
    reg r;
    for (int i = 0; i < width; ++i) r[i] = bf16_to_float(p[i]);
    return r;
  }
  static float f16_scalar(uint16_t h) { return fp16_to_float(h); }
  static reg hsum_rows(const reg* a) { return reg{(a[0][0] + a[0][1]) + (a[0][2] + a[0][3]), (a[1][0] + a[1][1]) + (a[1][2] + a[1][3]),
                                                  (a[2][0] + a[2][1]) + (a[2][2] + a[2][3]), (a[3][0] + a[3][1]) + (a[3][2] + a[3][3])}; }
};

constexpr TiledKernels kKernels = TiledSimd<Portable>::table("portable");

}  // namespace

const TiledKernels& kernels_portable() { return kKernels; }

}  // namespace flashlite::cpu_tiled
