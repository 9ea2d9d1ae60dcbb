// `flashlite`: the command-line tool (attn | info | bench | generate | chat | score | tokenize | serve).
#include <iostream>
#include <vector>

#include "cli_checks.h"
#include "commands.h"
#include "flashlite/errors.h"
#include "flashlite/version.h"

int main(int argc, char** argv) {
  CLI::App app{"flashlite: exact, IO-aware attention for GPUs and CPUs, and a Llama inference engine"};
  app.add_flag_callback("--version", [] {
    std::cout << "flashlite " << flashlite::version() << "\n";
    throw CLI::Success();
  }, "Print the version and exit");
  app.require_subcommand(1);
  flashlite::cli::add_attn_command(app);
  flashlite::cli::add_info_command(app);
  flashlite::cli::add_bench_command(app);
  flashlite::cli::add_engine_commands(app);
  flashlite::cli::add_serve_command(app);
  app.footer("Run 'flashlite SUBCOMMAND --help' for the options of one subcommand.");
  try {
    flashlite::cli::check_subcommand_words(app, argc, argv);
    std::vector<const char*> words(argv, argv + argc);
    if (const int mark = flashlite::cli::passthrough_mark(app, argc, argv)) words.erase(words.begin() + mark);
    app.parse(int(words.size()), words.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const flashlite::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
