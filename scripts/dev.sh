#!/usr/bin/env bash
# One entry point on a fresh Debian 12 machine: installs what is missing, builds, then runs.
#   scripts/dev.sh train [mixprec train flags]   set up, build, train on Fashion-MNIST
#   scripts/dev.sh test [PART...]                set up, build, run every check, or only the PARTs named:
#                                                release-suite, install (examples/ built against the installed
#                                                package), format (clang-format), tidy (clang-tidy), tsan (the
#                                                threaded tests under TSan), asan-suite (the suite under
#                                                ASan/UBSan), fuzz (libFuzzer on the file readers,
#                                                MIXPREC_FUZZ_SECONDS per target, 30)
#   scripts/dev.sh bench [compare.py flags]      set up (plus python3-torch), build, compare with PyTorch
#   scripts/dev.sh build                         set up and build only
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
jobs=$(nproc)

# openmpi-bin, libopenmpi-dev: data parallelism (src/dist/, its tests under mpirun; CMake's MIXPREC_MPI).
packages=(g++ cmake ninja-build libdnnl-dev openmpi-bin libopenmpi-dev ocl-icd-opencl-dev zlib1g-dev nlohmann-json3-dev libgtest-dev dataset-fashion-mnist
  libcli11-dev # the CLI's flags (apps/mixprec/cli.cpp)
  gnuplot-nox # the chart of compare and plot (and its test)
  pkg-config  # test: the examples built against the installed mixprec.pc
  clang-format-14 clang-tidy-14 libomp-14-dev # libomp-14-dev: omp.h where clang-tidy looks for it
  clang-14 libclang-rt-14-dev) # the fuzz targets: clang's libFuzzer and sanitizer runtimes
# bench compares with PyTorch; test checks checkpoints both ways with it (ctest interop.pytorch).
# libopenblas0-openmp: Debian's torch is built with BLAS_INFO=generic, so its fp32 matmuls run on
# whatever libblas.so.3 is; OpenBLAS (on libgomp, torch's own thread pool) instead of netlib's
# single-threaded reference BLAS, 10-100x slower (bench/README.md).
[ "${1:-}" = bench ] || [ "${1:-}" = test ] && packages+=(python3-torch python3-numpy libopenblas0-openmp)

setup() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "dev.sh: installing ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# The text corpus of `train --model gpt` (--text's default): Moby Dick, which Debian ships only as test
# data inside a Go package. The package is downloaded (not installed: no dependencies), unpacked into
# a temporary directory, and only the text is kept. Skipped when the file is there.
text_file=/usr/local/share/mixprec/mobydick.txt
text_package=golang-github-colinmarc-hdfs-dev
text_in_package=usr/share/gocode/src/github.com/colinmarc/hdfs/testdata/mobydick.txt
fetch_text() {
  [ -s "$text_file" ] && return 0
  local sudo="" tmp
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  tmp=$(mktemp -d)
  # apt-get download writes to the current directory; the package lists may be missing or stale on
  # a machine where every package was already installed: update them once and retry.
  if ! (cd "$tmp" && apt-get download -qq "$text_package" >/dev/null 2>&1); then
    $sudo apt-get update -qq
    (cd "$tmp" && apt-get download -qq "$text_package" >/dev/null)
  fi
  dpkg-deb -x "$tmp"/"$text_package"_*.deb "$tmp/root"
  $sudo install -D -m 644 "$tmp/root/$text_in_package" "$text_file"
  rm -rf "$tmp"
  echo "dev.sh: $text_file from Debian's $text_package"
}

# build DIR CMAKE_ARGS... : configure once, then build incrementally (every target, or only $target).
build() {
  local dir=$1
  shift
  # MIXPREC_CUDA_ARCHS=90 (CI, GPU runs): build the CUDA backend for that architecture alone.
  mkdir -p "$dir"
  if ! cmake -S "$root" -B "$dir" -G Ninja ${MIXPREC_CUDA_ARCHS:+-DMIXPREC_CUDA_ARCHS="$MIXPREC_CUDA_ARCHS"} "$@" \
    >"$dir/configure.log" 2>&1; then
    cat "$dir/configure.log" >&2
    return 1
  fi
  grep -E '^-- mixprec:' "$dir/configure.log" || true  # whether the CUDA backend is built, and why
  cmake --build "$dir" -j "$jobs" ${target:+--target "$target"}
}

release() { build "$root/build" -DCMAKE_BUILD_TYPE=Release -DMIXPREC_WERROR=ON; }

# The parts of `test`. Each is one && chain: they run as `if` conditions, where bash ignores set -e.
release_suite() { release && (cd "$root/build" && ctest --output-on-failure -j "$jobs"); }
# The same suite under AddressSanitizer and UndefinedBehaviorSanitizer.
asan_suite() {
  build "$root/build-asan" -DCMAKE_BUILD_TYPE=Debug -DMIXPREC_SANITIZE=ON -DMIXPREC_WERROR=ON &&
    (cd "$root/build-asan" && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j "$jobs")
}
# ThreadSanitizer on the suites that start threads (the loader's producer thread, autocast on
# several threads at once), built alone in their own directory. OMP_NUM_THREADS=1: libgomp is not
# built with TSan, so the barriers and the thread pool of an OpenMP parallel region are invisible
# to it and every region would be reported as a race between its team's threads. With one OpenMP
# thread a region runs on the thread that enters it, so all TSan sees is the std::thread
# concurrency these tests are about, instrumented. One library we call is not instrumented either:
# reports with a oneDNN frame are suppressed (tests/tsan.supp says why). (Races inside OpenMP
# regions are beyond TSan with an uninstrumented libgomp either way.)
# setarch -R: without address-space randomisation. GCC 12's TSan runtime knows a fixed memory layout
# and stops ("FATAL: ThreadSanitizer: unexpected memory mapping") on kernels that randomise mmap
# with more bits (vm.mmap_rnd_bits 32, newer distributions' default); the tests do not need it.
tsan_suite() {
  local norandom=()
  setarch "$(uname -m)" -R true 2>/dev/null && norandom=(setarch "$(uname -m)" -R)
  target=mixprec_thread_tests build "$root/build-tsan" -DCMAKE_BUILD_TYPE=Debug -DMIXPREC_TSAN=ON -DMIXPREC_WERROR=ON &&
    OMP_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$root/tests/tsan.supp" \
      "${norandom[@]}" "$root/build-tsan/mixprec_thread_tests"
}

# libFuzzer on the file readers (tests/fuzz/: the safetensors header parser, the idx reader), built
# alone with clang under ASan and UBSan in build-fuzz, each target run for MIXPREC_FUZZ_SECONDS from
# the seed corpus (tests/fuzz/corpus/; what a run adds stays in build-fuzz/corpus/ for the next).
# A crash, leak, timeout or sanitizer report fails the part; the input is left in
# build-fuzz/artifacts/ (copy it to tests/fuzz/regressions/<target>/: the suite replays those).
fuzz_suite() {
  local dir=$root/build-fuzz seconds=${MIXPREC_FUZZ_SECONDS:-30} status=0 t
  mkdir -p "$dir/artifacts"
  if ! cmake -S "$root/tests/fuzz" -B "$dir" -G Ninja -DCMAKE_CXX_COMPILER=clang++-14 >"$dir/configure.log" 2>&1; then
    cat "$dir/configure.log" >&2
    return 1
  fi
  cmake --build "$dir" -j "$jobs" || return 1
  for t in safetensors idx; do
    mkdir -p "$dir/corpus/$t"
    local dict=()
    [ -f "$root/tests/fuzz/$t.dict" ] && dict=(-dict="$root/tests/fuzz/$t.dict")
    # -timeout: one input running 10 s is a hang; -rss_limit_mb: one using 2 GB is a leak or a bomb.
    if "$dir/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "${dict[@]}" \
      -artifact_prefix="$dir/artifacts/$t-" "$dir/corpus/$t" "$root/tests/fuzz/corpus/$t" >"$dir/$t.log" 2>&1; then
      echo "fuzz $t: $(grep -E '^Done [0-9]+ runs' "$dir/$t.log" | tail -1), no crash, leak or sanitizer report"
    else
      grep -v '^"' "$dir/$t.log" | tail -40 >&2
      echo "fuzz $t: FAILED (log: $dir/$t.log; input: $dir/artifacts/$t-*)" >&2
      status=1
    fi
  done
  return $status
}

# The installed package as a user gets it: build/ (built by release) installed into a temporary
# prefix, no second library build; examples/ built against it as a project of its own
# (find_package(mixprec), CMAKE_PREFIX_PATH) and with `pkg-config --cflags --libs mixprec`, and every
# example run from both builds. The prefix must hold only the headers, the library, its CMake
# package, mixprec.pc and the CLI. Cleans up. (The shared library: docs/install.md, by hand.)
install_check() {
  local tmp status=0
  release || return 1
  tmp=$(mktemp -d)
  install_and_build_examples "$tmp" || status=1
  rm -rf "$tmp"
  return $status
}
install_and_build_examples() {
  local tmp=$1 f name extra flags
  quiet "$tmp/install.log" cmake --install "$root/build" --prefix "$tmp/prefix" || return 1
  extra=$( (cd "$tmp/prefix" && find . -type f -o -type l) | sed 's|^\./||' |
    grep -Ev '^(include/mixprec/[a-z_0-9]+\.h|lib/libmixprec\.(a|so[.0-9]*)|lib/cmake/mixprec/mixprec[A-Za-z-]*\.cmake|lib/pkgconfig/mixprec\.pc|bin/mixprec)$')
  [ -z "$extra" ] || { echo "install: unexpected files in the prefix: ${extra//$'\n'/ }" >&2 && return 1; }
  # CMake: a project of its own that finds the package.
  quiet "$tmp/configure.log" cmake -S "$root/examples" -B "$tmp/cmake" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" \
    -DCMAKE_BUILD_TYPE=Release || return 1
  cmake --build "$tmp/cmake" -j "$jobs" || return 1
  (cd "$tmp/cmake" && ctest --output-on-failure) || return 1  # one at a time: each runs on every core
  # pkg-config: one compiler line per example; each run from an empty directory (they write only there).
  flags=$(PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" pkg-config --cflags --libs mixprec) || return 1
  mkdir -p "$tmp/pc"
  for f in "$root"/examples/*.cpp; do
    name=$(basename "$f" .cpp)
    # shellcheck disable=SC2086 # $flags is a list of flags
    g++ -O2 "$f" -o "$tmp/pc/example_$name" $flags || return 1
    (cd "$tmp/pc" && quiet "$name.log" "./example_$name") || { echo "install: example_$name (pkg-config build) failed" >&2 && return 1; }
  done
  echo "install: examples/ built against the installed package and run, with CMake and with pkg-config ($flags)"
}
# quiet LOG COMMAND...: COMMAND's output goes to LOG, shown only when it fails.
quiet() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 || { cat "$log" >&2 && return 1; }
}

# part NAME COMMAND...: runs one part of `test`, timed; a failure is recorded, the next part runs.
# Its output is shown and kept in build-logs/NAME.log, for the report of the failed parts at the end
# (the end is what a CI log shows).
failed=()
times=()
logs=$root/build-logs
part() {
  local name=$1 start=$SECONDS status=ok
  shift
  mkdir -p "$logs"
  rm -f "$logs/$name.failed"
  echo "=== dev.sh test: $name"
  # The part as the left of ||: an `if` condition for set -e, as when it ran without the pipe.
  { "$@" || echo "exit $?" >"$logs/$name.failed"; } 2>&1 | tee "$logs/$name.log"
  [ ! -e "$logs/$name.failed" ] || { status=FAILED; failed+=("$name"); }
  times+=("$(printf '  %-16s %5d s  %s' "$name" $((SECONDS - start)) "$status")")
}
# What went wrong in a failed part, in a few lines: its error and failure lines, then its last lines.
failure_report() {
  local name=$1 log=$logs/$1.log
  echo "=== dev.sh test: $name FAILED ($(cat "$logs/$name.failed")); its error lines, then its end (all: $log)"
  grep -E 'FAIL|Failed|[Ee]rror|error:|Sanitizer|runtime error|No space|Killed|Timeout|unexpected' "$log" |
    grep -v -E '^ *Start |Passed|-Werror|_error\.|Error\.[A-Z]' | tail -40 | cut -c1-300
  echo "--- the last lines of $name:"
  tail -25 "$log" | cut -c1-300
}

cmd=${1:-}
shift || true
setup
fetch_text
setup_seconds=$SECONDS
case "$cmd" in
  build) release ;;
  train)
    release
    exec "$root/build/mixprec" train "$@"
    ;;
  test)
    # Every part runs (one report shows every problem); the command fails if any part failed.
    # `test PART...` runs only the parts named (a CI failure reproduced without the hour of the rest).
    all_parts=(format release-suite install tidy tsan asan-suite fuzz)
    for p in "$@"; do
      [[ " ${all_parts[*]} " == *" $p "* ]] || { echo "dev.sh: no part '$p' (parts: ${all_parts[*]})" >&2 && exit 2; }
    done
    selected=("$@")
    wanted() { ((${#selected[@]} == 0)) || [[ " ${selected[*]} " == *" $1 "* ]]; }
    wanted format && part format scripts/lint.sh format
    wanted release-suite && part release-suite release_suite
    wanted install && part install install_check
    wanted tidy && part tidy scripts/lint.sh tidy "$root/build" # reads build/compile_commands.json
    wanted tsan && part tsan tsan_suite
    wanted asan-suite && part asan-suite asan_suite
    wanted fuzz && part fuzz fuzz_suite
    for p in "${failed[@]}"; do failure_report "$p"; done
    echo "=== dev.sh test: times"
    printf '  %-16s %5d s\n' set-up "$setup_seconds"
    printf '%s\n' "${times[@]}"
    if ((${#failed[@]})); then
      echo "dev.sh test: FAILED: ${failed[*]}" >&2
      exit 1
    fi
    echo "dev.sh test: every part passed"
    ;;
  bench)
    release
    exec /usr/bin/python3 "$root/bench/compare.py" --mixprec "$root/build/mixprec" "$@"
    ;;
  *)
    echo "usage: scripts/dev.sh train|test|bench|build [flags]" >&2
    exit 2
    ;;
esac
