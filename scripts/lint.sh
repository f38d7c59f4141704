#!/usr/bin/env bash
# The style and static checks that `scripts/dev.sh test` runs (Debian 12's clang 14 tools):
#   scripts/lint.sh format       lists every C++ file that .clang-format would change; fails if any
#   scripts/lint.sh tidy BUILD   clang-tidy with .clang-tidy's checks, as errors, on src/ and apps/,
#                                compiled as BUILD/compile_commands.json says
# Fix a file's format with `clang-format-14 -i FILE`. The versioned tools are named on purpose:
# another clang-format version formats some constructs differently.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

# The C++ sources and headers of the repository (src/ops/ops.def is left out: a table aligned by
# hand, which clang-format would reflow).
cxx_files() { find "$@" -type f \( -name '*.cpp' -o -name '*.h' \) | LC_ALL=C sort; }

format() {
  local bad=()
  while IFS= read -r f; do
    clang-format-14 --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done < <(cxx_files src include apps tests bench)
  if ((${#bad[@]})); then
    echo "lint format: ${#bad[@]} file(s) differ from .clang-format (clang-format-14 -i FILE fixes one):" >&2
    printf '  %s\n' "${bad[@]}" >&2
    return 1
  fi
  echo "lint format: every file is formatted"
}

tidy() {
  local build=${1:?usage: scripts/lint.sh tidy BUILD_DIR}
  [ -f "$build/compile_commands.json" ] || { echo "lint tidy: no $build/compile_commands.json (configure first)" >&2; return 1; }
  # One clang-tidy per file, $jobs at a time; a file's report is printed whole, only when it fails.
  # (Headers are checked through the files that include them: HeaderFilterRegex in .clang-tidy.)
  # The .cpp files of src/ and apps/ that this build compiles (a build without CUDA has no
  # compile command for src/**/cuda/, and clang-tidy cannot parse those without the toolkit).
  local files
  files=$(sed -n 's/^ *"file": "\(.*\)",\{0,1\}$/\1/p' "$build/compile_commands.json" |
    grep -E "^$(pwd)/(src|apps)/.*\.cpp$" | LC_ALL=C sort -u) || true
  [ -n "$files" ] || { echo "lint tidy: no src/ or apps/ file in $build/compile_commands.json" >&2; return 1; }
  if printf '%s\n' "$files" | xargs -P "$jobs" -I{} sh -c \
    'out=$(clang-tidy-14 -p "$0" --quiet "$1" 2>&1) || { printf "%s\n" "$out" | grep -v "warnings\{0,1\} generated\.$"; exit 1; }' \
    "$build" {}; then
    echo "lint tidy: no findings in src/ and apps/"
  else
    echo "lint tidy: findings above (checks: .clang-tidy)" >&2
    return 1
  fi
}

case "${1:-}" in
  format) format ;;
  tidy) tidy "${2:-}" ;;
  *)
    echo "usage: scripts/lint.sh format | tidy BUILD_DIR" >&2
    exit 2
    ;;
esac
