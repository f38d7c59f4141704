// Flag parsing with one-line errors that name the flag, the value and what was expected.
#include "args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "mixprec/error.h"

namespace mixprec::cli {

Args::Args(const std::string& command, const std::vector<std::string>& argv) : command_(command) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    MIXPREC_CHECK(a.size() > 2 && a.compare(0, 2, "--") == 0, "unexpected argument '", a,
                  "' (flags look like --name value)");
    std::string name = a.substr(2), value;
    const auto eq = name.find('=');
    bool has_value = false;
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    } else if (i + 1 < argv.size() && argv[i + 1].compare(0, 2, "--") != 0) {
      value = argv[++i];
      has_value = true;
    }
    MIXPREC_CHECK(!values_.count(name), "flag --", name, " given twice");
    values_[name] = value;
    if (!has_value) switches_.insert(name);
  }
}

std::string Args::raw(const std::string& name) {
  used_.insert(name);
  MIXPREC_CHECK(!switches_.count(name), "flag --", name, " needs a value");
  return values_.at(name);
}

bool Args::flag(const std::string& name) {
  used_.insert(name);
  if (!has(name)) return false;
  if (switches_.count(name)) return true;
  const std::string& v = values_.at(name);
  MIXPREC_CHECK(v == "true" || v == "false" || v == "1" || v == "0", "--", name,
                " takes no value (or true/false), got '", v, "'");
  return v == "true" || v == "1";
}

std::string Args::str(const std::string& name, const std::string& def) {
  return has(name) ? raw(name) : (used_.insert(name), def);
}

std::string Args::choice(const std::string& name, const std::string& def, const std::vector<std::string>& allowed) {
  std::string v = str(name, def);  // not const: returned by move
  for (const auto& a : allowed)
    if (a == v) return v;
  std::ostringstream os;
  for (size_t i = 0; i < allowed.size(); ++i) os << (i ? "|" : "") << allowed[i];
  throw Error(detail::concat("--", name, " must be one of ", os.str(), ", got '", v, "'"));
}

int64_t Args::integer(const std::string& name, int64_t def, int64_t lo, int64_t hi) {
  if (!has(name)) {
    used_.insert(name);
    return def;
  }
  const std::string v = raw(name);
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  MIXPREC_CHECK(!v.empty() && *end == '\0' && errno == 0, "--", name, " must be an integer, got '", v, "'");
  MIXPREC_CHECK(x >= lo && x <= hi, "--", name, " must be in [", lo, ", ", hi, "], got ", x);
  return x;
}

double Args::real(const std::string& name, double def, double lo, double hi, bool lo_open) {
  if (!has(name)) {
    used_.insert(name);
    return def;
  }
  const std::string v = raw(name);
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  MIXPREC_CHECK(!v.empty() && *end == '\0' && std::isfinite(x), "--", name, " must be a number, got '", v, "'");
  MIXPREC_CHECK((lo_open ? x > lo : x >= lo) && x <= hi, "--", name, " must be ", lo_open ? "> " : ">= ", lo,
                " and <= ", hi, ", got ", v);
  return x;
}

std::vector<int64_t> Args::int_list(const std::string& name, const std::vector<int64_t>& def, int64_t lo, int64_t hi) {
  if (!has(name)) {
    used_.insert(name);
    return def;
  }
  const std::string v = raw(name);
  std::vector<int64_t> out;
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long long x = std::strtoll(item.c_str(), &end, 10);
    MIXPREC_CHECK(!item.empty() && *end == '\0', "--", name, " must be a comma-separated list of integers, got '", v,
                  "'");
    MIXPREC_CHECK(x >= lo && x <= hi, "--", name, " values must be in [", lo, ", ", hi, "], got ", x);
    out.push_back(x);
  }
  MIXPREC_CHECK(!out.empty(), "--", name, " is empty");
  return out;
}

void Args::finish() const {
  for (const auto& [name, v] : values_)
    MIXPREC_CHECK(used_.count(name), "unknown flag --", name, " (see `mixprec ", command_, " --help`)");
}

Args Args::with_defaults(const std::map<std::string, std::string>& defaults) const {
  Args out = *this;
  out.used_.clear();
  for (const auto& [name, value] : defaults) out.values_.emplace(name, value);  // keeps a given value
  return out;
}

}  // namespace mixprec::cli
