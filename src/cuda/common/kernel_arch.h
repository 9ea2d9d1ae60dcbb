#pragma once
// Whether a kernel's loaded code is sm_90 or later: public, for the engine too (include/flashlite/cuda/kernel_arch.h).
#include "flashlite/cuda/kernel_arch.h"
