#pragma once
// The numbered variants of the tuning sweep (bf16): X(id, head_dim, BR, BC, warps, stages, q_in_registers, feat).
// MT = BR / (16 * warps) m16 tiles per warp; feat = the kernel's optional steps (fwd_mma.cuh: 1 fold scale,
// 2 skip rescale, 4 early pack; 7 = all, as in production). Each variant is checked against the float64 reference
// before it is timed; the winner per head_dim goes into FL_FWD_MMA_CONFIGS and launch.cu's dispatch.
#define FL_SWEEP_VARIANTS(X)            \
  X(1, 64, 128, 64, 8, 2, true, 7)      \
  X(2, 64, 128, 128, 8, 2, true, 7)     \
  X(3, 64, 128, 64, 4, 2, true, 7)      \
  X(4, 64, 128, 128, 4, 2, true, 7)     \
  X(5, 64, 128, 128, 4, 2, false, 7)    \
  X(6, 64, 64, 64, 4, 2, true, 7)       \
  X(7, 64, 128, 64, 8, 3, true, 7)      \
  X(8, 64, 128, 128, 8, 3, true, 7)     \
  X(9, 64, 128, 64, 4, 3, true, 7)      \
  X(10, 64, 128, 64, 4, 2, true, 0)     \
  X(11, 128, 128, 64, 4, 2, false, 7)   \
  X(12, 128, 64, 64, 4, 2, true, 7)     \
  X(13, 128, 128, 64, 8, 2, true, 7)    \
  X(14, 128, 128, 32, 4, 2, false, 7)   \
  X(15, 128, 128, 64, 8, 3, true, 7)    \
  X(16, 128, 64, 64, 4, 3, true, 7)     \
  X(17, 128, 128, 128, 8, 2, true, 7)   \
  X(18, 128, 128, 64, 4, 3, false, 7)   \
  X(19, 128, 128, 64, 4, 2, false, 0)   \
  X(20, 128, 128, 64, 4, 2, false, 5)   \
  X(21, 128, 128, 64, 4, 2, false, 6)   \
  X(22, 128, 128, 64, 4, 2, false, 3)   \
  X(23, 64, 128, 128, 4, 2, false, 3)   \
  X(24, 64, 128, 64, 4, 2, true, 3)
