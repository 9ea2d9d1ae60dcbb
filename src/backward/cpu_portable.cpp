// The CPU backward's tile work built for portable (flags from src/CMakeLists.txt; run only after cpu.cpp's CPU check).
#define FL_BWD_ISA portable
#define FL_BWD_TABLE kPortable
#define FL_BWD_NAME "portable"
#include "backward/cpu_tiles.h"
