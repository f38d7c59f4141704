// A small command-line flag parser: --name value or --name=value, typed getters with range
// checks, and an error for every flag that was given but never read.
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

namespace mixprec::cli {

class Args {
 public:
  // argv after the subcommand. Throws mixprec::Error on a malformed argument.
  Args(const std::string& command, const std::vector<std::string>& argv);

  bool has(const std::string& name) const { return values_.count(name) != 0; }
  bool flag(const std::string& name);  // boolean switch: --name (or --name=true/false)
  std::string str(const std::string& name, const std::string& def);
  std::string choice(const std::string& name, const std::string& def, const std::vector<std::string>& allowed);
  int64_t integer(const std::string& name, int64_t def, int64_t lo, int64_t hi);
  double real(const std::string& name, double def, double lo, double hi, bool lo_open = false);
  std::vector<int64_t> int_list(const std::string& name, const std::vector<int64_t>& def, int64_t lo, int64_t hi);
  // Call after all getters: rejects flags nobody read (typos, flags of another command).
  void finish() const;
  // These flags plus `defaults` ("name" -> value) for the names not given, none read yet: a
  // resumed run takes its checkpoint's settings wherever the command line gives none.
  Args with_defaults(const std::map<std::string, std::string>& defaults) const;

 private:
  std::string command_;
  std::map<std::string, std::string> values_;
  std::set<std::string> switches_;  // given without a value
  std::set<std::string> used_;
  std::string raw(const std::string& name);
};

}  // namespace mixprec::cli
