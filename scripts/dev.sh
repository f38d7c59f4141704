#!/usr/bin/env bash
# One entry point on a fresh Debian 12 machine: installs what is missing, builds, then runs.
#   scripts/dev.sh train [mixprec train flags]   set up, build, train on Fashion-MNIST
#   scripts/dev.sh test                          set up, build, run the whole suite (Release + ASan/UBSan)
#   scripts/dev.sh bench [compare.py flags]      set up (plus python3-torch), build, compare with PyTorch
#   scripts/dev.sh build                         set up and build only
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
jobs=$(nproc)

packages=(g++ cmake ninja-build libdnnl-dev ocl-icd-opencl-dev zlib1g-dev nlohmann-json3-dev libgtest-dev dataset-fashion-mnist)
[ "${1:-}" = bench ] && packages+=(python3-torch python3-numpy)

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

# build DIR CMAKE_ARGS... : configure once, then build incrementally.
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
  cmake --build "$dir" -j "$jobs"
}

release() { build "$root/build" -DCMAKE_BUILD_TYPE=Release -DMIXPREC_WERROR=ON; }

cmd=${1:-}
shift || true
setup
case "$cmd" in
  build) release ;;
  train)
    release
    exec "$root/build/mixprec" train "$@"
    ;;
  test)
    release
    (cd "$root/build" && ctest --output-on-failure -j "$jobs")
    # The sanitizer job: the same suite under AddressSanitizer and UndefinedBehaviorSanitizer.
    build "$root/build-asan" -DCMAKE_BUILD_TYPE=Debug -DMIXPREC_SANITIZE=ON -DMIXPREC_WERROR=ON
    (cd "$root/build-asan" && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j "$jobs")
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
