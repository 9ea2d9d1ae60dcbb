#pragma once
// The host fp16 / bf16 conversions are public (the engine and the CLI use them): include/flashlite/dtype.h.
#include "flashlite/dtype.h"
