#pragma once
// The numbered variants of the tuning sweep (bf16): X(id, head_dim, BR, BC, warps, stages, q_in_registers).
// MT = BR / (16 * warps) m16 tiles per warp. Each is checked against the float64 reference before it is timed;
// the winner per head_dim goes into src/cuda/fwd/fwd_launch.h (FL_FWD_MMA_CONFIGS) and launch.cu's dispatch.
#define FL_SWEEP_VARIANTS(X)         \
  X(1, 64, 128, 64, 8, 2, true)      \
  X(2, 64, 128, 128, 8, 2, true)     \
  X(3, 64, 128, 64, 4, 2, true)      \
  X(4, 64, 128, 128, 4, 2, true)     \
  X(5, 64, 128, 128, 4, 2, false)    \
  X(6, 64, 64, 64, 4, 2, true)       \
  X(7, 64, 128, 64, 8, 3, true)      \
  X(8, 64, 128, 128, 8, 3, true)     \
  X(11, 128, 128, 64, 4, 2, false)   \
  X(12, 128, 64, 64, 4, 2, true)     \
  X(13, 128, 128, 64, 8, 2, true)    \
  X(14, 128, 128, 32, 4, 2, false)   \
  X(15, 128, 128, 64, 8, 3, true)    \
  X(16, 128, 64, 64, 4, 3, true)     \
  X(17, 128, 128, 128, 8, 2, true)   \
  X(18, 128, 128, 64, 4, 3, false)
