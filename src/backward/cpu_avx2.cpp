// The CPU backward's tile work built for avx2 (flags from src/CMakeLists.txt; run only after cpu.cpp's CPU check).
#define FL_BWD_ISA avx2
#define FL_BWD_TABLE kAvx2
#define FL_BWD_NAME "avx2"
#include "backward/cpu_tiles.h"
