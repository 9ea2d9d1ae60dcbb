// flashlite_safetensors_check FILE...: opens each file with the engine's safetensors parser and prints one line per
// file, "ok <tensors>" or "error <message>" (anything else, or a crash, is a bug). test_safetensors_diff.py runs it
// on mutated files and compares the verdicts with the `safetensors` package's.
#include <cstdio>
#include <exception>
#include <string>

#include "engine/safetensors.h"
#include "flashlite/errors.h"

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    try {
      flashlite::engine::SafetensorsFile f(argv[i]);
      std::printf("ok %zu\n", f.tensors().size());
    } catch (const flashlite::Error& e) {
      std::string m = e.what();
      for (char& ch : m)
        if (ch == '\n') ch = ' ';
      std::printf("error %s\n", m.c_str());
    } catch (const std::exception& e) {
      std::printf("unexpected %s\n", e.what());
    }
    std::fflush(stdout);
  }
  return 0;
}
