// The CLI's flags, declared once per subcommand and parsed by CLI11 (cli.cpp): each declaration
// binds a variable and carries its help, default and range or choices, so every `--help` is
// generated from them and a bad value is refused (one line naming the flag) before any work.
// Deliberately a small facade: CLI11's header costs seconds per translation unit, and every flag
// gets the same value checks and help layout.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace mixprec::cli {

// Flags by name (without the dashes) as text: what a checkpoint records of its run's settings.
using Flags = std::map<std::string, std::string>;

// One subcommand's flags. Declare, parse (run_main), then read the bound variables; given() and
// has() say where a value came from.
class Command {
 public:
  // A subcommand of `parent` (run_main's), or with parent null one of its own: the flags of a
  // checkpoint's metadata are read through the same declarations (take_defaults).
  Command(CLI::App* parent, const std::string& name, const std::string& about);
  ~Command();
  Command(const Command&) = delete;
  Command& operator=(const Command&) = delete;

  // The flags declared after group() are listed under `title` in --help; with `models`, they
  // belong to those models only (check_model_flags).
  Command& group(const std::string& title, std::vector<std::string> models = {});

  // default_note: the help's default where the variable's value is not it ("model's recipe").
  Command& integer(const std::string& name, int64_t& var, int64_t lo, int64_t hi, const std::string& help,
                   const std::string& default_note = "");
  // lo_open: the value must be > lo (else >= lo).
  Command& real(const std::string& name, double& var, double lo, double hi, const std::string& help,
                bool lo_open = false, const std::string& default_note = "");
  Command& text(const std::string& name, std::string& var, const std::string& value_name, const std::string& help,
                const std::string& default_note = "");
  Command& choice(const std::string& name, std::string& var, const std::vector<std::string>& choices,
                  const std::string& help, const std::string& default_note = "");
  // Comma-separated integers in [lo, hi], at least one.
  Command& int_list(const std::string& name, std::vector<int64_t>& var, int64_t lo, int64_t hi,
                    const std::string& help);
  // Comma-separated names, each one of `choices`, each once, at least one.
  Command& choice_list(const std::string& name, std::vector<std::string>& var, const std::vector<std::string>& choices,
                       const std::string& help);
  // A switch: --name (or --name=true/false).
  Command& flag(const std::string& name, bool& var, const std::string& help);
  // A setting that is on or off: --name alone is true, or --name true|false.
  Command& boolean(const std::string& name, bool& var, const std::string& help, const std::string& default_note);
  // A size in bytes: 1000000, 512MiB, 1GiB, 1.5GB (parse_size). 0: none given.
  Command& size(const std::string& name, int64_t& bytes, const std::string& help);
  // The arguments that are no flag, at least one.
  Command& positionals(const std::string& name, std::vector<std::string>& var, const std::string& help);
  // The flag must be given (after take_defaults: or taken from a checkpoint).
  Command& required(const std::string& name);

  const std::string& name() const { return name_; }
  // On the command line.
  bool given(const std::string& flag) const;
  // On the command line, or set by take_defaults.
  bool has(const std::string& flag) const;
  // Sets every declared flag of `defaults` that the command line did not give, as if given (the
  // same checks; a bad value names `source`). A resumed run takes its checkpoint's settings so.
  void take_defaults(const Flags& defaults, const std::string& source);
  // Refuses a given flag that belongs to other models than `model`: "unknown flag --layers for
  // --model mlp".
  void check_model_flags(const std::string& model) const;

  // Only for run_main: after the parse, the unknown flags and stray arguments are refused.
  void finish_parse();
  CLI::App* app() { return app_; }

 private:
  CLI::Option* add(const std::string& name, const std::string& value_name, const std::string& help,
                   const std::string& default_text);
  std::unique_ptr<CLI::App> own_;  // with no parent
  CLI::App* app_;
  std::string name_;
  std::string group_ = "Options";
  std::vector<std::string> group_models_;
  std::map<std::string, std::vector<std::string>> models_;  // flag -> the models it belongs to
  std::set<std::string> set_by_defaults_;
};

// What a subcommand runs once its flags are parsed: declare() binds its flags to state it keeps
// and returns the run.
struct CommandDef {
  const char* name;
  const char* about;
  std::function<std::function<int()>(Command&)> declare;
};

// `mixprec COMMAND [flags]`: parses, then runs the command. A bad flag: one line
// "mixprec COMMAND: error: ...", exit 1; no command or an unknown one: exit 2. `version`: what
// --version prints.
int run_main(int argc, char** argv, const std::vector<CommandDef>& commands, const std::string& version);

// "1GiB", "512MiB", "1.5GB", "1000000" (bytes) -> bytes; otherwise throws one line that starts
// with `what` (may be empty) and the text.
int64_t parse_size(const std::string& text, const std::string& what);
// "1.0 GiB", "512.0 MiB", "816 B".
std::string format_size(int64_t bytes);

}  // namespace mixprec::cli
