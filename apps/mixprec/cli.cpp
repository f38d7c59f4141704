// The flag declarations on CLI11: every flag is one text value, checked and converted by the
// same parse function (a CLI11 validator, so a bad value fails in the parse, naming the flag), and
// its help line says its default and range or choices.
#include "cli.h"

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <utility>

#include "mixprec/error.h"

namespace mixprec::cli {
namespace {

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += sep;
    s += v[i];
  }
  return s;
}

std::string number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

int64_t parse_int(const std::string& v, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  MIXPREC_CHECK(!v.empty() && *end == '\0' && errno == 0, "must be an integer, got '", v, "'");
  MIXPREC_CHECK(x >= lo && x <= hi, "must be in [", lo, ", ", hi, "], got ", x);
  return x;
}

double parse_real(const std::string& v, double lo, double hi, bool lo_open) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  MIXPREC_CHECK(!v.empty() && *end == '\0' && std::isfinite(x), "must be a number, got '", v, "'");
  MIXPREC_CHECK((lo_open ? x > lo : x >= lo) && x <= hi, "must be ", lo_open ? "> " : ">= ", lo, " and <= ", hi,
                ", got ", v);
  return x;
}

std::vector<std::string> split(const std::string& v) {
  std::vector<std::string> out;
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  if (!v.empty() && v.back() == ',') out.emplace_back();  // "1," has an empty last item
  return out;
}

std::vector<int64_t> parse_int_list(const std::string& v, int64_t lo, int64_t hi) {
  std::vector<int64_t> out;
  for (const std::string& item : split(v)) {
    char* end = nullptr;
    const long long x = std::strtoll(item.c_str(), &end, 10);
    MIXPREC_CHECK(!item.empty() && *end == '\0', "must be a comma-separated list of integers, got '", v, "'");
    MIXPREC_CHECK(x >= lo && x <= hi, "values must be in [", lo, ", ", hi, "], got ", x);
    out.push_back(x);
  }
  MIXPREC_CHECK(!out.empty(), "is empty");
  return out;
}

const std::string& parse_choice(const std::string& v, const std::vector<std::string>& choices) {
  for (const auto& c : choices)
    if (c == v) return c;
  throw Error(detail::concat("must be one of ", join(choices, "|"), ", got '", v, "'"));
}

std::vector<std::string> parse_choice_list(const std::string& v, const std::vector<std::string>& choices) {
  std::vector<std::string> out;
  for (const std::string& item : split(v)) {
    MIXPREC_CHECK(!item.empty(), "must be a comma-separated list, got '", v, "'");
    for (const auto& c : choices)
      if (c == item) out.push_back(c);
    MIXPREC_CHECK(!out.empty() && out.back() == item, "'", item, "' is not one of ", join(choices, "|"));
    for (size_t i = 0; i + 1 < out.size(); ++i) MIXPREC_CHECK(out[i] != item, "names '", item, "' twice");
  }
  MIXPREC_CHECK(!out.empty(), "is empty");
  return out;
}

bool parse_bool(const std::string& v) {
  MIXPREC_CHECK(v == "true" || v == "false" || v == "1" || v == "0", "takes true or false, got '", v, "'");
  return v == "true" || v == "1";
}

// A validator that runs `parse` on the value: its message (without a trailing period) becomes
// CLI11's "--flag: message".
CLI::Validator checked_by(std::function<void(const std::string&)> parse) {
  return CLI::Validator(
      [parse = std::move(parse)](std::string& v) -> std::string {
        try {
          parse(v);
          return "";
        } catch (const Error& e) {
          return e.what();
        }
      },
      "");
}

// `text` broken into lines of at most `width` characters at spaces: the help formatter indents
// each line under the description column.
std::string wrap(const std::string& text, size_t width = 84) {
  std::string out, line;
  std::istringstream words(text);
  for (std::string w; words >> w;) {
    if (!line.empty() && line.size() + 1 + w.size() > width) {
      out += line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + w;
  }
  return out + line;
}

// The help's column of flag names: wide enough for "--clip-grad-norm X" and its like.
class Formatter : public CLI::Formatter {
 public:
  Formatter() { column_width(34); }
  std::string make_option_opts(const CLI::Option* opt) const override {
    return opt->get_type_name().empty() || opt->get_type_name() == "FLAG" ? "" : " " + opt->get_type_name();
  }
};

}  // namespace

Command::Command(CLI::App* parent, const std::string& name, const std::string& about) : name_(name) {
  if (parent) {
    app_ = parent->add_subcommand(name, about);
  } else {
    own_ = std::make_unique<CLI::App>(about, name);
    app_ = own_.get();
  }
  app_->formatter(std::make_shared<Formatter>());
  app_->allow_extras();  // refused by finish_parse, in our words
}

Command::~Command() = default;

Command& Command::group(const std::string& title, std::vector<std::string> models) {
  group_ = title;
  group_models_ = std::move(models);
  return *this;
}

CLI::Option* Command::add(const std::string& name, const std::string& value_name, const std::string& help,
                          const std::string& default_text) {
  std::string desc = help;
  if (!default_text.empty()) desc += " (default: " + default_text + ")";
  // "o,out": -o and --out, named out.
  const size_t comma = name.find(',');
  CLI::Option* o = app_->add_option(
      comma == std::string::npos ? "--" + name : "-" + name.substr(0, comma) + ",--" + name.substr(comma + 1));
  o->description(wrap(desc))
      ->type_name(value_name)
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::Throw)
      ->group(group_);
  if (!group_models_.empty()) models_[name] = group_models_;
  return o;
}

Command& Command::integer(const std::string& name, int64_t& var, int64_t lo, int64_t hi, const std::string& help,
                          const std::string& default_note) {
  const std::string range = hi >= INT64_MAX / 2 ? detail::concat(">= ", lo) : detail::concat(lo, " to ", hi);
  CLI::Option* o = add(name, "N", help + "; " + range, default_note.empty() ? std::to_string(var) : default_note);
  o->check(checked_by([lo, hi](const std::string& v) { parse_int(v, lo, hi); }));
  o->each([&var, lo, hi](const std::string& v) { var = parse_int(v, lo, hi); });
  return *this;
}

Command& Command::real(const std::string& name, double& var, double lo, double hi, const std::string& help,
                       bool lo_open, const std::string& default_note) {
  const std::string range = (lo_open ? "> " : ">= ") + number(lo) + (hi < 1e30 ? ", <= " + number(hi) : "");
  CLI::Option* o = add(name, "X", help + "; " + range, default_note.empty() ? number(var) : default_note);
  o->check(checked_by([=](const std::string& v) { parse_real(v, lo, hi, lo_open); }));
  o->each([&var, lo, hi, lo_open](const std::string& v) { var = parse_real(v, lo, hi, lo_open); });
  return *this;
}

Command& Command::text(const std::string& name, std::string& var, const std::string& value_name,
                       const std::string& help, const std::string& default_note) {
  CLI::Option* o = add(name, value_name, help, default_note.empty() ? var : default_note);
  o->each([&var](const std::string& v) { var = v; });
  return *this;
}

Command& Command::choice(const std::string& name, std::string& var, const std::vector<std::string>& choices,
                         const std::string& help, const std::string& default_note) {
  CLI::Option* o = add(name, join(choices, "|"), help, default_note.empty() ? var : default_note);
  o->check(checked_by([choices](const std::string& v) { parse_choice(v, choices); }));
  o->each([&var, choices](const std::string& v) { var = parse_choice(v, choices); });
  return *this;
}

Command& Command::int_list(const std::string& name, std::vector<int64_t>& var, int64_t lo, int64_t hi,
                           const std::string& help) {
  std::vector<std::string> def;
  for (int64_t x : var) def.push_back(std::to_string(x));
  CLI::Option* o = add(name, "N,N,...", help, join(def, ","));
  o->check(checked_by([lo, hi](const std::string& v) { parse_int_list(v, lo, hi); }));
  o->each([&var, lo, hi](const std::string& v) { var = parse_int_list(v, lo, hi); });
  return *this;
}

Command& Command::choice_list(const std::string& name, std::vector<std::string>& var,
                              const std::vector<std::string>& choices, const std::string& help) {
  CLI::Option* o = add(name, "P,P,...", help + "; each one of " + join(choices, ", "), join(var, ","));
  o->check(checked_by([choices](const std::string& v) { parse_choice_list(v, choices); }));
  o->each([&var, choices](const std::string& v) { var = parse_choice_list(v, choices); });
  return *this;
}

Command& Command::flag(const std::string& name, bool& var, const std::string& help) {
  CLI::Option* o = app_->add_flag("--" + name, var, wrap(help));
  o->group(group_)->multi_option_policy(CLI::MultiOptionPolicy::Throw);
  if (!group_models_.empty()) models_[name] = group_models_;
  return *this;
}

Command& Command::boolean(const std::string& name, bool& var, const std::string& help,
                          const std::string& default_note) {
  CLI::Option* o = add(name, "[true|false]", help, default_note);
  o->expected(0, 1)->default_str("true");  // --name alone: true
  o->check(checked_by([](const std::string& v) { parse_bool(v); }));
  o->each([&var](const std::string& v) { var = v.empty() || parse_bool(v); });
  return *this;
}

Command& Command::size(const std::string& name, int64_t& bytes, const std::string& help) {
  CLI::Option* o = add(name, "SIZE", help + "; bytes, or with a unit: 1GiB, 512MiB, 1.5GB", "none");
  o->check(checked_by([](const std::string& v) { parse_size(v, ""); }));
  o->each([&bytes](const std::string& v) { bytes = parse_size(v, ""); });
  return *this;
}

Command& Command::positionals(const std::string& name, std::vector<std::string>& var, const std::string& help) {
  CLI::Option* o = app_->add_option(name, var, help);
  o->type_name("")->expected(1, CLI::detail::expected_max_vector_size)->required();
  return *this;
}

Command& Command::required(const std::string& name) {
  app_->get_option("--" + name)->required();
  return *this;
}

bool Command::has(const std::string& flag) const { return app_->count("--" + flag) > 0; }

bool Command::given(const std::string& flag) const { return has(flag) && !set_by_defaults_.count(flag); }

void Command::take_defaults(const Flags& defaults, const std::string& source) {
  for (const auto& [k, v] : defaults) {
    CLI::Option* o = app_->get_option_no_throw("--" + k);
    if (!o || o->count() > 0) continue;
    try {
      o->add_result(v);
      o->run_callback();
    } catch (const CLI::Error& e) {
      throw Error(detail::concat(source, ": ", e.what()));
    }
    set_by_defaults_.insert(k);
  }
}

void Command::check_model_flags(const std::string& model) const {
  for (const auto& [flag, models] : models_) {
    if (!given(flag)) continue;
    bool ok = false;
    for (const auto& m : models) ok = ok || m == model;
    MIXPREC_CHECK(ok, "unknown flag --", flag, " for --model ", model, " (it is ", join(models, " and "),
                  "'s; see `mixprec ", name_, " --help`)");
  }
}

void Command::finish_parse() {
  const std::vector<std::string> rest = app_->remaining();
  if (rest.empty()) return;
  const std::string& a = rest.front();
  if (a.size() > 1 && a[0] == '-')
    throw Error(detail::concat("unknown flag ", a.substr(0, a.find('=')), " (see `mixprec ", name_, " --help`)"));
  throw Error(detail::concat("unexpected argument '", a, "' (flags look like --name value)"));
}

int64_t parse_size(const std::string& text, const std::string& what) {
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  const std::string unit = end ? std::string(end) : "";
  // Decimal units (GB: 10^9) and binary ones (GiB: 2^30), as `ls`, `df` and PyTorch write them.
  static const std::pair<const char*, double> units[] = {
      {"", 1},      {"B", 1},        {"KB", 1e3},        {"MB", 1e6},           {"GB", 1e9},
      {"TB", 1e12}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  double scale = 0;
  for (const auto& [name, factor] : units)
    if (unit == name) scale = factor;
  const std::string quoted = (what.empty() ? "'" : what + " '") + text + "'";
  MIXPREC_CHECK(end != text.c_str() && std::isfinite(x) && scale > 0, quoted,
                " is no size: bytes, or a number with B, KB, MB, GB, TB, KiB, MiB, GiB or TiB (1GiB, 512MiB, 1.5GB)");
  const double bytes = std::floor(x * scale);
  MIXPREC_CHECK(bytes >= 1 && bytes < 9.2e18, quoted, " must be at least 1 byte and below 8 EiB");
  return int64_t(bytes);
}

std::string format_size(int64_t bytes) {
  const double b = double(bytes);
  char buf[32];
  if (b >= 1073741824.0)
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / 1073741824.0);
  else if (b >= 1048576.0)
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / 1048576.0);
  else if (b >= 1024.0)
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%lld B", (long long)bytes);
  return buf;
}

int run_main(int argc, char** argv, const std::vector<CommandDef>& commands, const std::string& version) {
  CLI::App app(
      "mixprec: automatic mixed-precision training (autocast, GradScaler, f32 master weights) on CPUs "
      "and NVIDIA GPUs. `mixprec COMMAND --help` lists a command's flags.",
      "mixprec");
  app.formatter(std::make_shared<Formatter>());
  app.set_version_flag("--version", version);
  app.require_subcommand(0, 1);
  std::vector<std::unique_ptr<Command>> cmds;
  std::vector<std::function<int()>> runs;
  for (const CommandDef& d : commands) {
    cmds.push_back(std::make_unique<Command>(&app, d.name, d.about));
    runs.push_back(d.declare(*cmds.back()));
  }
  const std::string first = argc > 1 ? argv[1] : "";
  if (argc < 2) {
    std::fputs(app.help().c_str(), stderr);
    return 2;
  }
  if (first == "help") {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  }
  if (first == "version") {
    std::printf("%s\n", version.c_str());
    return 0;
  }
  bool known = first[0] == '-';
  for (const CommandDef& d : commands) known = known || first == d.name;
  if (!known) {
    std::fprintf(stderr, "mixprec: unknown command '%s' (try `mixprec --help`)\n", first.c_str());
    return 2;
  }
  const char* who = first[0] == '-' ? "mixprec" : nullptr;
  const std::string prefix = who ? std::string(who) : "mixprec " + first;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::RequiredError& e) {
    // Ours: "--out FILE is required", the flag with its value's name.
    std::string msg = e.what();
    for (const auto& c : cmds)
      if (c->name() == first)
        for (const CLI::Option* o : c->app()->get_options())
          if (msg == o->get_name() + " is required" && !o->get_type_name().empty())
            msg = o->get_name() + " " + o->get_type_name() + " is required";
    std::fprintf(stderr, "%s: error: %s\n", prefix.c_str(), msg.c_str());
    return 1;
  } catch (const CLI::ArgumentMismatch& e) {
    // CLI11's "--epochs: At Most 1 required but received 2": every flag takes one value, once.
    const std::string msg = e.what();
    std::fprintf(stderr, "%s: error: %s given twice\n", prefix.c_str(), msg.substr(0, msg.find(':')).c_str());
    return 1;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: error: %s\n", prefix.c_str(), e.what());
    return 1;
  }
  for (size_t i = 0; i < cmds.size(); ++i) {
    if (!cmds[i]->app()->parsed()) continue;
    try {
      cmds[i]->finish_parse();
      return runs[i]();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: error: %s\n", prefix.c_str(), e.what());
      return 1;
    }
  }
  std::fputs(app.help().c_str(), stderr);
  return 2;
}

}  // namespace mixprec::cli
