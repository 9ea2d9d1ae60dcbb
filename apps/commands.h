#pragma once
// Subcommands of the `flashlite` CLI; each add_* registers its subcommands and their handlers on the app.
#include <CLI/CLI.hpp>

namespace flashlite::cli {

void add_attn_command(CLI::App& app);    // apps/cmd_attn.cpp
void add_info_command(CLI::App& app);    // apps/cmd_info.cpp
void add_bench_command(CLI::App& app);   // apps/cmd_bench.cpp
void add_engine_commands(CLI::App& app); // apps/cmd_engine.cpp: generate, chat, tokenize
void add_serve_command(CLI::App& app);   // apps/cmd_serve.cpp: serve (built with the server, FLASHLITE_HAVE_SERVER)

}  // namespace flashlite::cli
