// The CPU backward's tile work built for avx512 (flags from src/CMakeLists.txt; run only after cpu.cpp's CPU check).
#define FL_BWD_ISA avx512
#define FL_BWD_TABLE kAvx512
#define FL_BWD_NAME "avx512"
#include "backward/cpu_tiles.h"
