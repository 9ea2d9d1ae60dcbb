// prefill() on CUDA against float64 (skipped without a GPU). (being written)
#include <gtest/gtest.h>
