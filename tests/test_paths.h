// Where the tests find the source tree and the CLI: the build's own paths, unless MIXPREC_SOURCE_DIR
// or MIXPREC_CLI is set in the environment (binaries run on another machine: scripts/gpu/run.sh).
#pragma once
#include <cstdlib>
#include <string>

namespace mixprec::test {

inline std::string env_or(const char* name, const char* built_in) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : std::string(built_in);
}
inline std::string source_dir() { return env_or("MIXPREC_SOURCE_DIR", MIXPREC_SOURCE_DIR); }
inline std::string cli_path() { return env_or("MIXPREC_CLI", MIXPREC_CLI); }

}  // namespace mixprec::test
