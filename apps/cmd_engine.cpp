// PLACEHOLDER until the engine lands (owned by the engine work): registers nothing.
#include "commands.h"

namespace flashlite::cli {

void add_engine_commands(CLI::App&) {}

}  // namespace flashlite::cli
