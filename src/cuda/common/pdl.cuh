#pragma once
// Programmatic dependent launch, device side: public, for the engine too (include/flashlite/cuda/pdl.cuh).
#include "flashlite/cuda/pdl.cuh"
