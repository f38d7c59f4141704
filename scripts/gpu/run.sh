#!/usr/bin/env bash
# A GPU run on the device machine, in the repo root, with gpu-pack/ carried (scripts/gpu/pack.sh):
# every step logged with its time under $OUT, a failed step reported and the next one run where it
# still makes sense. docs/gpu.md says how a session spends its 30 minutes with it.
#
# Usage: scripts/gpu/run.sh [STEP...]      (no STEP: all)
#   inventory  GPU, driver, OS, glibc, nvcc, where cuBLASLt/cuDNN/cudart are and their versions, torch
#              (always runs first: it is the record of which machine ran the rest)
#   setup      unpack the bundle, find the CUDA libraries, check `mixprec --version` and `devices`;
#              else build from source with the kit (MIXPREC_GPU_BUILD=auto|bundle|source)
#   test       the CUDA suites (TEST_FILTER, default '*Cuda*:*_cuda_*:*_cuda:CliDevices.*:DeviceTensors.*:FusedRelu.*':
#              the Cuda suites, every op and attention case on cuda, the CLI's device tests, the fused ReLUs'
#              NaN test, which runs on GPU 0 too): run/skipped/failed counts;
#              then the tests of a machine without a GPU, with the GPU hidden (NOGPU_FILTER)
#   memcheck   the same suites under compute-sanitizer: memcheck, racecheck, synccheck, initcheck
#              (SANITIZER_TOOLS; MEMCHECK_FILTER, MEMCHECK_EXCLUDE, SANITIZER_EXCLUDE); initcheck runs
#              the tests that read cuBLASLt's 16-bit products apart (INITCHECK_APART), its reports
#              checked to lie in those products alone (initcheck_map.py --check)
#   train-gpu  mlp and cnn 5 epochs x fp32/amp-fp16/amp-bf16 x seeds 0,1,2 on the GPU
#   train-cpu  the same runs on the CPU (the accuracy comparison; 16 cores, minutes)
#   bench      bench/peers/torch_gpu.py: mixprec bench against PyTorch eager and torch.compile
#   profile    mixprec bench --profile on the GPU (mlp, cnn 420/1000 and 32/64, gpt; amp-bf16, amp-fp16, fp32): each
#              kernel's time (the profiler waits for the stream around each) against cuBLASLt's rate
#              (PROFILE_MODELS: those four by default, and gpt2: GPT-2 124M's shape at batch 8;
#              PROFILE_PRECISIONS; PROFILE_VARIANTS: each profile once per variant, a variant
#              `default` or comma-separated NAME=VALUE settings or --flags, e.g. 'default
#              MIXPREC_CUDA_ATTENTION=wmma,MIXPREC_CUDA_LAYER_NORM=block': the new kernels and the old;
#              'default --channels-last': the cnn in NCHW and NHWC)
#   max-batch  the seeds' experiment: `mixprec max-batch --device cuda` on cnn 420,1000 and
#              bench/peers/torch_max_batch.py under the same limit(s) (MAXBATCH_LIMITS, 3GiB), each
#              precision's largest batch and its ratio to fp32's, side by side (MAXBATCH_FLAGS: mixprec's
#              search again with each of these flags, e.g. --channels-last)
#   initcheck-probe  which buffer initcheck's reads inside cuBLASLt hit: the captured-step test
#              (PROBE_FILTER) under initcheck with MIXPREC_TRACE_CUBLASLT=1, the addresses mapped to
#              the traced operands by scripts/gpu/initcheck_map.py (results/initcheck-map.txt)
#   all        inventory setup test memcheck train-gpu bench (train-cpu apart: see docs/gpu.md)
#   A+B        steps A and B at once, each under the same limit (memcheck+train-gpu: neither times anything)
# Out ($OUT, at most 8 files come back): run.log (this output), summary.json, gpu-run.md (the
# fragment for docs/gpu.md), logs.tar.xz (every step's log and raw results).
# Env: RUN_BUDGET_S (560: the whole call, under the tool's 600 s), TRAIN_MODELS (mlp,cnn),
#   TRAIN_PRECISIONS (fp32,amp-fp16,amp-bf16), TRAIN_SEEDS (0,1,2), TRAIN_EPOCHS (5),
#   CNN_CHANNELS (32,64), BENCH_ARGS (extra torch_gpu.py flags), TORCH_PYTHON (python3),
#   MAXBATCH_LIMITS (3GiB; comma-separated), MAXBATCH_PRECISIONS (fp32,amp-fp16,amp-bf16,half-bf16),
#   MAXBATCH_FLAGS (mixprec max-batch again with each, e.g. --channels-last),
#   RUN_WITHOUT_GPU=1 (run the GPU steps on a machine without one: dry runs), FRESH=1 (drop the
#   results that earlier calls left on a warm machine; they are otherwise summarised together).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
self=$root/scripts/gpu/run.sh
W=$root/build-gpu # ignored (/build*/): kept between calls while the machine stays warm
OUT=${OUT:-/tmp/mixprec-gpu-out}
PACK=$root/gpu-pack
DATA=$PACK/data/fashion-mnist
# The mixprec flag that puts a run on the GPU: one place to change (CPU runs get none).
GPU_FLAG=(--device cuda)
# FRESH=1: forget the results of earlier calls on this (warm) machine.
[ "${FRESH:-0}" = 1 ] && [ "${1:-}" != --step ] && rm -rf "$W/logs" "$W/results" "$W/steps.jsonl"
mkdir -p "$W/logs" "$W/results" "$OUT"

if [ -z "${TORCH_PYTHON:-}" ]; then
  TORCH_PYTHON=python3
  # Here (Debian), python3 may be a pyenv without torch; /usr/bin/python3 has Debian's torch.
  python3 -c 'import torch' 2>/dev/null || { [ -x /usr/bin/python3 ] && TORCH_PYTHON=/usr/bin/python3; }
fi
export TORCH_PYTHON

log() { echo "[$(date -u +%H:%M:%S)] $*"; }

# xz archives through Python's tarfile: the machine's image may have no xz program.
PY_TAR='
import sys, tarfile
if sys.argv[1] == "x":
    with tarfile.open(sys.argv[2]) as t:
        t.extractall(sys.argv[3], **({"filter": "tar"} if hasattr(tarfile, "data_filter") else {}))
else:
    with tarfile.open(sys.argv[2], "w:xz") as t:
        for p in sys.argv[3:]:
            t.add(p)
'
untar() { python3 -c "$PY_TAR" x "$1" "$2"; } # untar ARCHIVE DIR

# ---------------------------------------------------------------------------------------------
# The steps. Each runs as `run.sh --step NAME` in its own process under `timeout`, with its output
# in $W/logs/NAME.log; exit 0 ok, 77 skipped (the reason on its last line), anything else failed.

gpu_present() { [ "${RUN_WITHOUT_GPU:-0}" = 1 ] || python3 -c '
import json, sys; sys.exit(0 if json.load(open(sys.argv[1])).get("gpus") else 1)' "$W/results/inventory.json"; }

need_gpu() {
  gpu_present || {
    echo "skipped: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["device_line"])' "$W/results/inventory.json" 2>/dev/null || echo 'no GPU: the inventory is missing')"
    exit 77
  }
}
need_binary() {
  [ -f "$W/env.sh" ] || {
    echo "skipped: no working mixprec binary (the setup step failed or did not run)"
    exit 77
  }
  # shellcheck source=/dev/null
  . "$W/env.sh" # MIXPREC, MIXPREC_TESTS (wrappers), MIXPREC_REAL_TESTS, MIXPREC_LD_PATH, BUILT_HOW
}

step_inventory() {
  local man=()
  [ -f "$PACK/manifest.json" ] && man=(--manifest "$PACK/manifest.json")
  set +e # the raw listings below are for the log: none of them may stop inventory.py
  echo "== date: $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git -C "$root" rev-parse HEAD 2>/dev/null || echo '?')"
  echo "== nvidia-smi"
  nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  echo "== uname -a; os-release; ldd --version"
  uname -a
  grep -E '^(PRETTY_NAME|VERSION_ID)=' /etc/os-release || true
  ldd --version 2>&1 | sed -n 1p # sed, not head: head would end ldd with SIGPIPE, a failure under pipefail
  echo "== nvcc --version; ls /usr/local"
  (command -v nvcc && nvcc --version) || /usr/local/cuda/bin/nvcc --version || echo "nvcc: not found"
  ls -d /usr/local/cuda* /usr/local/nvidia 2>/dev/null || true
  echo "== free -g; df -h ."
  free -g || true
  df -h . || true
  set -e
  echo "== inventory.py"
  python3 "$root/scripts/gpu/inventory.py" "${man[@]}" --torch-python "$TORCH_PYTHON" \
    --json-out "$W/results/inventory.json"
}

# LD_LIBRARY_PATH for mixprec: the CUDA libraries' directories inventory.py chose (the ones torch
# loads). Only the mixprec wrappers get it: torch's own process stays as it is.
cuda_ld_path() {
  python3 - "$W/results/inventory.json" <<'EOF'
import json, sys
dirs = []
for stem in ("libcudnn", "libcublasLt", "libcublas", "libcudart", "libnvrtc", "libnvJitLink"):
    d = json.load(open(sys.argv[1]))["lib_dirs"].get(stem, {}).get("dir")
    if d and d not in dirs:
        dirs.append(d)
print(":".join(dirs))
EOF
}

# write_env BIN_DIR LD_PATH HOW: wrappers that run mixprec with its libraries, and env.sh for the steps.
write_env() {
  local bin=$1 ld=$2 how=$3
  mkdir -p "$W/bin"
  for b in mixprec mixprec_tests; do
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%q${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %q "$@"\n' "$ld" "$bin/$b" >"$W/bin/$b"
    chmod +x "$W/bin/$b"
  done
  {
    printf 'MIXPREC=%q\nMIXPREC_TESTS=%q\nMIXPREC_REAL_TESTS=%q\n' "$W/bin/mixprec" "$W/bin/mixprec_tests" "$bin/mixprec_tests"
    printf 'MIXPREC_LD_PATH=%q\nBUILT_HOW=%q\n' "$ld" "$how"
  } >"$W/env.sh"
}

# try_binary BIN_DIR LD_PATH: does the binary start (the library path as the wrappers will set it)?
# It prints what `mixprec devices` sees, and warns when that is no GPU on a machine that has one.
try_binary() {
  local bin=$1 ld=$2${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} out
  LD_LIBRARY_PATH=$ld "$bin/mixprec" --version || return 1
  out=$(LD_LIBRARY_PATH=$ld "$bin/mixprec" devices) || return 1
  echo "$out"
  if gpu_present && grep -q '^cuda: none' <<<"$out"; then
    echo "WARNING: mixprec sees no GPU where nvidia-smi lists one: the CUDA tests will skip (driver or library path?)"
  fi
}

use_bundle() {
  [ -f "$PACK/bundle.tar.xz" ] || {
    echo "no $PACK/bundle.tar.xz: was gpu-pack carried (carry: [\"gpu-pack\"]) after scripts/gpu/pack.sh?"
    return 1
  }
  rm -rf "$W/bundle" && untar "$PACK/bundle.tar.xz" "$W"
  local ld out
  ld=$(cuda_ld_path)
  echo "CUDA library path: $ld"
  if out=$(try_binary "$W/bundle" "$ld" 2>&1); then
    echo "$out"
    write_env "$W/bundle" "$ld" bundle
    return 0
  fi
  echo "$out"
  # An older libstdc++ than Debian 12's: ours is in lib/compat.
  if grep -q 'GLIBCXX\|CXXABI\|libstdc++\|libgcc_s' <<<"$out"; then
    echo "retrying with the bundle's libstdc++ (lib/compat)"
    ld="$W/bundle/lib/compat:$ld"
    if out=$(try_binary "$W/bundle" "$ld" 2>&1); then
      echo "$out"
      write_env "$W/bundle" "$ld" "bundle + its libstdc++"
      return 0
    fi
    echo "$out"
  fi
  return 1
}

# The fallback: build this tree here with the kit (oneDNN, OpenCL, json, zlib headers + CMake configs,
# GoogleTest sources), the machine's nvcc and the CUDA libraries found by the inventory.
build_from_source() {
  if [ ! -f "$PACK/kit.tar.xz" ] || [ ! -f "$PACK/bundle.tar.xz" ]; then
    echo "no kit.tar.xz/bundle.tar.xz in $PACK"
    return 1
  fi
  local arch prefix jobs inv
  arch=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["multiarch"])' "$PACK/manifest.json")
  # Unpacked once per kit: fresh header timestamps would make ninja rebuild everything on a warm
  # machine's next call.
  local stamp
  stamp=$(sha256sum "$PACK/kit.tar.xz" "$PACK/bundle.tar.xz" | cut -c1-64 | tr -d '\n')
  if [ "$(cat "$W/kit/.stamp" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$W/kit" "$W/gtest-build" "$W/bundle" && untar "$PACK/kit.tar.xz" "$W" && untar "$PACK/bundle.tar.xz" "$W"
    echo "$stamp" >"$W/kit/.stamp"
  fi
  prefix=$W/kit/prefix
  jobs=$(nproc)
  inv=$W/results/inventory.json
  # The shared libraries come from the bundle, under the names the CMake configs expect.
  local dnnl_file
  dnnl_file=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["dnnl_file"])' "$PACK/manifest.json")
  cp "$W"/bundle/lib/libdnnl.so.* "$prefix/lib/$arch/$dnnl_file"
  ln -sf "$dnnl_file" "$prefix/lib/$arch/libdnnl.so"
  ln -sf "$dnnl_file" "$prefix/lib/$arch/$(basename "$W"/bundle/lib/libdnnl.so.*)"
  cp "$W"/bundle/lib/libOpenCL.so.1 "$prefix/lib/$arch/" && ln -sf libOpenCL.so.1 "$prefix/lib/$arch/libOpenCL.so"
  local zlib
  zlib=$(ls /usr/lib/"$arch"/libz.so.1 /lib/"$arch"/libz.so.1 2>/dev/null | sed -n 1p || true)
  [ -n "$zlib" ] || zlib=$W/bundle/lib/libz.so.1

  if [ ! -f "$prefix/lib/cmake/GTest/GTestConfig.cmake" ]; then
    log "building GoogleTest from the kit"
    cmake -S "$W/kit/googletest" -B "$W/gtest-build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF \
      -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib >/dev/null
    cmake --build "$W/gtest-build" -j "$jobs" >/dev/null && cmake --install "$W/gtest-build" >/dev/null
  fi

  # cuDNN and cuBLASLt where the inventory found them; headers beside them (the wheels ship include/).
  local cudnn_lib cublaslt_lib cudnn_inc extra_inc="" nvcc
  cudnn_lib=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["lib_dirs"]["libcudnn"]["path"])' "$inv")
  cublaslt_lib=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["lib_dirs"]["libcublasLt"]["path"])' "$inv")
  # The headers of the library found: its wheel's include/ beside lib/, else the first found.
  cudnn_inc=$(dirname "$cudnn_lib")/../include
  [ -f "$cudnn_inc/cudnn_version.h" ] ||
    cudnn_inc=$(dirname "$(python3 -c 'import json,sys; print((json.load(open(sys.argv[1]))["headers"]["cudnn_version.h"] or [""])[0])' "$inv")")
  [ -f "$cudnn_inc/cudnn_version.h" ] || {
    echo "no cudnn_version.h on this machine: cannot build the CUDA backend"
    return 1
  }
  nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc)
  # cuBLASLt's header where the toolkit has none: the wheel's include/ directory.
  if [ ! -f "$(dirname "$nvcc")/../include/cublasLt.h" ]; then
    local h
    h=$(dirname "$cublaslt_lib")/../include/cublasLt.h
    [ -f "$h" ] || h=$(python3 -c 'import json,sys; print((json.load(open(sys.argv[1]))["headers"]["cublasLt.h"] or [""])[0])' "$inv")
    [ -n "$h" ] && extra_inc="-isystem $(dirname "$h")"
  fi
  log "configuring with nvcc $nvcc, cuDNN $cudnn_lib, cuBLASLt $cublaslt_lib"
  # No -DMIXPREC_WERROR: another compiler's new warnings must not stop a run.
  cmake -S "$root" -B "$W/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMIXPREC_CUDA=ON -DMIXPREC_CUDA_ARCHS=90 \
    -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_PREFIX_PATH="$prefix" \
    -Ddnnl_DIR="$prefix/lib/$arch/cmake/dnnl" -Dnlohmann_json_DIR="$prefix/share/cmake/nlohmann_json" \
    -DGTest_DIR="$prefix/lib/cmake/GTest" -DOpenCL_INCLUDE_DIR="$prefix/include" \
    -DOpenCL_LIBRARY="$prefix/lib/$arch/libOpenCL.so" -DZLIB_INCLUDE_DIR="$prefix/include" -DZLIB_LIBRARY="$zlib" \
    -DMIXPREC_CUDNN_INCLUDE="$cudnn_inc" -DMIXPREC_CUDNN_LIB="$cudnn_lib" -DCUDA_cublasLt_LIBRARY="$cublaslt_lib" \
    ${extra_inc:+"-DCMAKE_CXX_FLAGS=$extra_inc" "-DCMAKE_CUDA_FLAGS=$extra_inc"}
  cmake --build "$W/build" -j "$jobs" --target mixprec_cli mixprec_tests
  local ld
  ld="$prefix/lib/$arch:$(cuda_ld_path)"
  try_binary "$W/build" "$ld" || return 1
  write_env "$W/build" "$ld" "source build on the GPU machine"
}

step_setup() {
  [ -f "$W/results/inventory.json" ] || {
    echo "no inventory: run the inventory step first"
    return 1
  }
  rm -f "$W/env.sh"
  local mode=${MIXPREC_GPU_BUILD:-auto} versions_ok
  versions_ok=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(int(d["bundle_versions_ok"]), "; ".join(d["version_notes"]))' "$W/results/inventory.json")
  echo "MIXPREC_GPU_BUILD=$mode; the bundle's library versions: $([ "${versions_ok%% *}" = 1 ] && echo ok || echo "${versions_ok#? }")"
  # auto: the bundle first, also where the runtime libraries are older than the ones it was built
  # against (the note above says so, and the CUDA tests then show whether it works: a source build
  # costs minutes of a lease that has 15); the source build when the bundle does not start.
  if [ "$mode" != source ]; then
    [ "${versions_ok%% *}" = 1 ] || log "runtime libraries older than the bundle's: trying the bundle first"
    use_bundle && return 0
    [ "$mode" = bundle ] && return 1
    log "the bundle does not run here: building from source"
  fi
  build_from_source
}

step_test() {
  need_binary
  local filter=${TEST_FILTER:-*Cuda*:*_cuda_*:*_cuda:CliDevices.*:DeviceTensors.*:FusedRelu.*}
  gpu_present || echo "no GPU: the CUDA tests are expected to skip"
  # The tests find the source tree and the CLI through these (tests/test_paths.h).
  local rc=0
  MIXPREC_SOURCE_DIR=$root MIXPREC_CLI=$MIXPREC "$MIXPREC_TESTS" --gtest_filter="$filter" \
    --gtest_output="json:$W/results/tests.json" || rc=$?
  # A filter that matches nothing passes in gtest: here it is a failure.
  python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["tests"] else 1)' "$W/results/tests.json" ||
    {
      echo "no test matched --gtest_filter=$filter"
      return 1
    }
  # A captured step that does not replay the eager step's bits: once more without split-K in any
  # cuBLASLt matmul (MIXPREC_CUBLASLT_SPLIT_K=0, a diagnostic only: its result is logged, the
  # failure stands), so the run itself says whether split-K is the cause.
  if [ "$rc" != 0 ] && python3 -c 'import json,sys
r = json.load(open(sys.argv[1]))
sys.exit(0 if any(t.get("failures") for s in r["testsuites"] for t in s["testsuite"]
                  if t["name"] == "CapturedStepsReplayBitIdenticalToEagerSteps") else 1)' "$W/results/tests.json"; then
    echo "== CudaTrain.CapturedStepsReplayBitIdenticalToEagerSteps failed: again with MIXPREC_CUBLASLT_SPLIT_K=0"
    MIXPREC_CUBLASLT_SPLIT_K=0 MIXPREC_SOURCE_DIR=$root MIXPREC_CLI=$MIXPREC "$MIXPREC_TESTS" \
      --gtest_filter='CudaTrain.CapturedStepsReplayBitIdenticalToEagerSteps' \
      --gtest_output="json:$W/results/tests-no-split-k.json" && echo "== it passes without split-K" ||
      echo "== it fails without split-K too"
  fi
  # The tests of what a machine without a GPU says skip where there is one: run them again with
  # the GPU hidden from the process (CUDA_VISIBLE_DEVICES=-1), so that none of the filter's tests
  # goes unrun here.
  if gpu_present; then
    echo "== again with the GPU hidden: the tests that skip where there is one"
    CUDA_VISIBLE_DEVICES=-1 MIXPREC_SOURCE_DIR=$root MIXPREC_CLI=$MIXPREC "$MIXPREC_TESTS" \
      --gtest_filter="${NOGPU_FILTER:-*WithoutAGpu*:DeviceTensors.MissingGpuIsOneLine}" \
      --gtest_output="json:$W/results/tests-gpu-hidden.json" || rc=$?
  fi
  return $rc
}

# compute-sanitizer's path from the inventory; fails with a line where the toolkit has none.
sanitizer_path() {
  local cs
  cs=$(python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["tools"]["compute-sanitizer"]; print(t["path"] if t else "")' "$W/results/inventory.json")
  [ -n "$cs" ] || {
    echo "compute-sanitizer not found in the toolkit" >&2
    return 1
  }
  echo "$cs"
}

step_memcheck() {
  need_gpu
  need_binary
  local cs filter=${MEMCHECK_FILTER:-${TEST_FILTER:-*Cuda*:*_cuda_*:*_cuda:CliDevices.*:DeviceTensors.*:FusedRelu.*}}
  cs=$(sanitizer_path) || return 1
  # Each tool over the suites, one after the other: memcheck (out-of-bounds and misaligned
  # accesses, leaks), racecheck (shared-memory races in our block reductions), synccheck (barriers),
  # initcheck (reads of device memory never written). --target-processes all: tests that start the
  # CLI are checked too. The real binary, not the wrapper script, with the library path in the
  # environment. --report-api-errors no: a failed CUDA call is the code's own check to make (each
  # one's status is checked and thrown), and the suites provoke some on purpose (an allocation
  # larger than the GPU, a capture that waits for the GPU); the tools look for memory errors.
  # The tools after memcheck skip the suites of cuDNN's and cuBLASLt's own kernels (their shared
  # memory is theirs; memcheck covers the accesses), and the CLI's trainings (whole GPU processes,
  # mostly those libraries' kernels: racecheck had not finished CliDevices' second in 100 s on
  # 2026-11-27), SANITIZER_EXCLUDE: racecheck took 2 to 5 s per convolution case.
  local tool rc=0 out f
  for tool in ${SANITIZER_TOOLS:-memcheck racecheck synccheck initcheck}; do
    echo "=== sanitizer $tool"
    out=$W/results/memcheck-tests.json
    # memcheck leaves out the GPU max-batch search (the wide cnn stepped a dozen times at batches
    # of hundreds, each new batch timing every cuDNN engine: minutes under the tool), MEMCHECK_EXCLUDE.
    f="$filter-${MEMCHECK_EXCLUDE:-CliDevices.MaxBatch*}"
    if [ "$tool" != memcheck ]; then
      out=$W/results/$tool-tests.json
      f="$filter-${SANITIZER_EXCLUDE:-Gpu/CudaConv*:Gpu/CudaMatmul*:CliDevices.*}"
    fi
    # initcheck does not see the writes of the kernels cuBLASLt 13.1 runs for bf16 and f16 results
    # on an H200, eager or replayed, and reports every later read of memory only they wrote
    # (CudaTrain.EagerProductsInFreshMemoryReadByOurKernelGiveTheCpuSums: f32 products in fresh
    # memory are seen, 16-bit ones are not, and our sums of them are the CPU's; docs/gpu.md,
    # 2026-12-04, fourth session). The tests that read such memory run apart, below.
    [ "$tool" = initcheck ] && f="$f:$initcheck_apart_tests"
    MIXPREC_SOURCE_DIR=$root MIXPREC_CLI=$MIXPREC LD_LIBRARY_PATH=$MIXPREC_LD_PATH \
      "$cs" --tool "$tool" --target-processes all --report-api-errors no --error-exitcode 99 --print-limit 50 \
      "$MIXPREC_REAL_TESTS" --gtest_filter="$f" --gtest_output="json:$out" || rc=$?
    [ "$tool" = initcheck ] && { initcheck_apart "$cs" || rc=$?; }
  done
  return $rc
}

# initcheck over the tests `filter` with MIXPREC_TRACE_CUBLASLT=1, every report printed (the map
# needs the addresses) and the trace's lines in the same log; further arguments go to the tests.
traced_initcheck() {
  local cs=$1 filter=$2 log=$3
  shift 3
  MIXPREC_TRACE_CUBLASLT=1 MIXPREC_SOURCE_DIR=$root MIXPREC_CLI=$MIXPREC LD_LIBRARY_PATH=$MIXPREC_LD_PATH \
    "$cs" --tool initcheck --report-api-errors no --print-limit 100000 --show-backtrace no \
    "$MIXPREC_REAL_TESTS" --gtest_filter="$filter" "$@" >"$log" 2>&1
}

# The tests whose reads of cuBLASLt's 16-bit products initcheck reports (above), under traced
# initcheck: they pass when the tests pass and every report lies in a 16-bit product a traced
# cuBLASLt call wrote (scripts/gpu/initcheck_map.py --check); a report anywhere else fails the
# step. results/initcheck-apart.log, results/initcheck-apart-map.txt.
initcheck_apart_tests=${INITCHECK_APART:-CudaTrain.CapturedStepsReplayBitIdenticalToEagerSteps:CudaTrain.AReplayedProduct*:CudaTrain.InjectedInf*:CudaTrain.EagerProductsInFresh*}
initcheck_apart() {
  local cs=$1 log=$W/results/initcheck-apart.log rc=0
  echo "=== sanitizer initcheck_apart"  # a section of its own for summarize.py
  echo "the tests that read cuBLASLt's 16-bit products: $initcheck_apart_tests"
  traced_initcheck "$cs" "$initcheck_apart_tests" "$log" \
    --gtest_output="json:$W/results/initcheck_apart-tests.json" || rc=$?
  grep -E '^\[  (PASSED|FAILED) |ERROR SUMMARY' "$log" || true
  python3 "$root/scripts/gpu/initcheck_map.py" --check "$log" >"$W/results/initcheck-apart-map.txt" || rc=1
  grep '^check:' "$W/results/initcheck-apart-map.txt"
  # compute-sanitizer exits 0 with reports unless --error-exitcode: the check judges them; a test
  # that failed is the gtest exit status.
  return $rc
}

step_initcheck-probe() {
  need_gpu
  need_binary
  local cs log=$W/results/initcheck-probe.log rc=0
  cs=$(sanitizer_path) || return 1
  traced_initcheck "$cs" "${PROBE_FILTER:-CudaTrain.CapturedStepsReplayBitIdenticalToEagerSteps}" "$log" || rc=$?
  tail -5 "$log"
  python3 "$root/scripts/gpu/initcheck_map.py" "$log" | tee "$W/results/initcheck-map.txt"
  return $rc
}

# train DEVICE: bench/accuracy.py over the models, precisions and seeds; one JSON per model.
train() {
  local dev=$1 flags=() rc=0
  need_binary
  rm -f "$W/logs/train-$dev.runs"
  [ -f "$DATA/train-images-idx3-ubyte.gz" ] || {
    echo "no Fashion-MNIST in $DATA (gpu-pack/data)"
    return 1
  }
  [ "$dev" = gpu ] && flags=("${GPU_FLAG[@]}")
  local models=${TRAIN_MODELS:-mlp,cnn}
  for model in ${models//,/ }; do
    local extra=()
    [ "$model" = cnn ] && extra=(--channels "${CNN_CHANNELS:-32,64}")
    python3 "$root/bench/accuracy.py" --mixprec "$MIXPREC" --models "$model" \
      --precisions "${TRAIN_PRECISIONS:-fp32,amp-fp16,amp-bf16}" --seeds "${TRAIN_SEEDS:-0,1,2}" \
      --json-out "$W/results/train-$dev-$model.json" -- \
      --epochs "${TRAIN_EPOCHS:-5}" --data "$DATA" "${flags[@]}" "${extra[@]}" 2>&1 | tee -a "$W/logs/train-$dev.runs" || rc=1
  done
  if ((rc)); then # the step's note: how many runs failed, and the first one's error
    echo "$(grep -c '^FAILED:' "$W/logs/train-$dev.runs") runs failed; first: $(grep -m1 '^FAILED:' "$W/logs/train-$dev.runs" | sed 's/.*error: //')"
  fi
  return $rc
}
step_train-gpu() {
  need_gpu
  train gpu
}
step_train-cpu() { train cpu; }

step_bench() {
  need_gpu # RUN_WITHOUT_GPU=1: the PyTorch side on the CPU, a smoke test (give BENCH_ARGS small configs)
  local impls=mixprec,mixprec-graph,pytorch mixprec_args=() remaining
  if [ -f "$W/env.sh" ]; then
    need_binary
    mixprec_args=(--mixprec "$MIXPREC")
  else
    echo "no mixprec binary: timing PyTorch alone"
    impls=pytorch
  fi
  python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1])).get("gpus") else 1)' \
    "$W/results/inventory.json" || echo "no GPU: the PyTorch side runs on the CPU (a smoke test, not a figure)"
  remaining=${STEP_BUDGET_S:-500}
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
  PYTHONUNBUFFERED=1 "$TORCH_PYTHON" "$root/bench/peers/torch_gpu.py" --impls "$impls" "${mixprec_args[@]}" \
    --budget-s $((remaining > 120 ? remaining - 60 : remaining / 2)) --json-out "$W/results/bench.json" ${BENCH_ARGS:-}
}

step_profile() {
  need_gpu
  need_binary
  local model args p v s out
  for model in ${PROFILE_MODELS:-mlp cnn cnn-small gpt}; do
    # The bench step's configurations (bench/peers/torch_gpu.py): mlp 1024,1024 at batch 512, cnn
    # 420,1000 and 32,64 at batch 256, the char gpt.
    case $model in
    mlp) args=(--model mlp --hidden 1024,1024 --batch-size 512) ;;
    cnn) args=(--model cnn --channels 420,1000 --batch-size 256) ;;
    cnn-small) args=(--model cnn --channels 32,64 --batch-size 256) ;;
    gpt2) args=(--model gpt --layers 12 --heads 12 --d-model 768 --block-size 1024 --vocab-size 50304 --batch-size 8) ;;
    *) args=(--model "$model") ;;
    esac
    for p in ${PROFILE_PRECISIONS:-amp-bf16 amp-fp16 fp32}; do
      for v in ${PROFILE_VARIANTS:-default}; do
        # A variant: comma-separated NAME=VALUE settings of the run's environment (the kernels'
        # switches, e.g. MIXPREC_CUDA_ATTENTION=wmma), or `default` for none; named in the file.
        # A setting that starts with -- is a flag of the command instead (--channels-last).
        local -a env=() flags=() set=()
        [ "$v" = default ] || IFS=, read -r -a set <<<"$v"
        for s in "${set[@]}"; do
          case $s in --*) flags+=("$s") ;; *) env+=("$s") ;; esac
        done
        out=$W/results/profile-$model-$p$([ "$v" = default ] || echo "-${v//[^A-Za-z0-9=,_-]/_}").txt
        env "${env[@]}" "$MIXPREC" bench "${args[@]}" "${flags[@]}" --device cuda --precision "$p" --steps 10 \
          --warmup 3 --profile >"$out" || return 1
        echo "${out##*/}:"
        head -2 "$out"
      done
    done
  done
}

step_max-batch() {
  need_gpu
  need_binary
  local l v rc=0 prec=${MAXBATCH_PRECISIONS:-fp32,amp-fp16,amp-bf16,half-bf16}
  local limits=${MAXBATCH_LIMITS:-3GiB}
  for l in ${limits//,/ }; do
    echo "== limit $l"
    "$MIXPREC" max-batch --device cuda --model cnn --channels 420,1000 --memory-limit "$l" --precisions "$prec" \
      --json >"$W/results/maxbatch-mixprec-$l.json" || rc=1
    # MAXBATCH_FLAGS: mixprec's search again with these flags (e.g. --channels-last: cuDNN's NHWC
    # engines need no workspace to transpose), beside the default one; the table is the default's.
    for v in ${MAXBATCH_FLAGS:-}; do
      echo "-- mixprec max-batch $v"
      "$MIXPREC" max-batch --device cuda --model cnn --channels 420,1000 --memory-limit "$l" --precisions "$prec" \
        "$v" | tee "$W/results/maxbatch-mixprec-$l${v//[^A-Za-z0-9_-]/_}.txt" || rc=1
    done
    "$TORCH_PYTHON" "$root/bench/peers/torch_max_batch.py" --model cnn --channels 420,1000 --memory-limit "$l" \
      --precisions "$prec" --json >"$W/results/maxbatch-pytorch-$l.json" || rc=1
    python3 - "$W/results/maxbatch-mixprec-$l.json" "$W/results/maxbatch-pytorch-$l.json" <<'PY' || rc=1
import json, sys
def load(p):
    try:
        return {r["precision"]: r for r in json.load(open(p))["precisions"]}
    except Exception as e:  # a side that failed: its column stays empty
        print(f"{p}: {e}")
        return {}
m, t = load(sys.argv[1]), load(sys.argv[2])
print("| precision | mixprec batch | ratio | peak MiB | PyTorch batch | ratio | reserved peak MiB |")
print("|---|---|---|---|---|---|---|")
for p in list(m) + [p for p in t if p not in m]:
    a, b = m.get(p, {}), t.get(p, {})
    f = lambda r, k, d=1: (f"{r[k] / d:.2f}" if isinstance(r.get(k), float) else
                           f"{r[k] / d:.1f}" if d != 1 and r.get(k) is not None else str(r.get(k, "-")))
    print(f"| {p} | {f(a, 'batch')} | {f(a, 'ratio')} | {f(a, 'peak_bytes', 2**20)} | {f(b, 'batch')} | "
          f"{f(b, 'ratio')} | {f(b, 'max_memory_reserved', 2**20)} |")
PY
  done
  return $rc
}

# ---------------------------------------------------------------------------------------------
# One step in its own process: `run.sh --step NAME` (the driver below calls this under timeout).
case ${1:-} in
-h | --help)
  sed -n '2,/^set -euo/p' "$self" | sed '$d; s/^# \{0,1\}//'
  exit 0
  ;;
esac
if [ "${1:-}" = --step ]; then
  name=$2
  "step_$name"
  exit $?
fi

started=$(date +%s)
budget=${RUN_BUDGET_S:-560}
call_id=$(date -u +%Y%m%dT%H%M%SZ)
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(all)
expanded=(inventory)
for s in "${steps[@]}"; do
  case $s in
  all) expanded+=(setup test memcheck train-gpu bench) ;;
  inventory) ;;
  *)
    for part in ${s//+/ }; do
      case $part in
      setup | test | memcheck | train-gpu | train-cpu | bench | profile | max-batch | initcheck-probe) ;;
      *)
        echo "run.sh: unknown step '$part' (inventory setup test memcheck train-gpu train-cpu bench profile max-batch initcheck-probe all; A+B runs A and B at once)" >&2
        exit 2
        ;;
      esac
    done
    expanded+=("$s")
    ;;
  esac
done
# Steps that need the binary set it up first, once, if the call did not name setup.
if ! printf '%s\n' "${expanded[@]}" | grep -qx setup &&
  printf '%s\n' "${expanded[@]}" | tr + '\n' | grep -qxE 'test|memcheck|train-gpu|train-cpu|bench|profile|max-batch|initcheck-probe'; then
  expanded=(inventory setup "${expanded[@]:1}")
fi

# The steps, with their output on the console and in $OUT/run.log (tee ends before the script does).
main() {
  log "run.sh: steps ${expanded[*]}; budget ${budget} s; OUT=$OUT; work dir $W"

  finish() { # the summary and the logs, after every step: a call killed at its limit still has them
    python3 "$root/scripts/gpu/summarize.py" --work "$W" --out "$OUT" --root "$root" >/dev/null 2>"$W/logs/summarize.err" ||
      log "summarize.py failed: $(tail -3 "$W/logs/summarize.err")"
    (cd "$W" && python3 -c "$PY_TAR" c "$OUT/logs.tar.xz" logs results) 2>/dev/null || true
  }

  for s in "${expanded[@]}"; do
    left=$((budget - ($(date +%s) - started)))
    if ((left < 20)); then
      log "$s: not started, ${left} s of the budget left"
      echo "{\"call\":\"$call_id\",\"step\":\"$s\",\"status\":\"not started\",\"rc\":null,\"seconds\":0,\"note\":\"budget spent\"}" >>"$W/steps.jsonl"
      continue
    fi
    # A+B: the steps run at once (those that time nothing: memcheck beside train-gpu, say), each
    # under the same limit, and are recorded one by one when all have ended.
    local parts=(${s//+/ }) p pids=()
    log "== ${parts[*]}$([ ${#parts[@]} -gt 1 ] && echo ' (at once)') (at most $((left - 10)) s)"
    t0=$(date +%s)
    for p in "${parts[@]}"; do
      (
        prc=0
        STEP_BUDGET_S=$((left - 10)) timeout -k 5 $((left - 10)) bash "$self" --step "$p" >"$W/logs/$p.log" 2>&1 || prc=$?
        echo $prc >"$W/logs/$p.rc"
        echo $(($(date +%s) - t0)) >"$W/logs/$p.secs"
      ) &
      pids+=($!)
    done
    wait "${pids[@]}" || true
    for p in "${parts[@]}"; do
      rc=$(cat "$W/logs/$p.rc")
      secs=$(cat "$W/logs/$p.secs")
      case $rc in
      0) status=ok ;;
      77) status=skipped ;;
      124 | 137) status=timeout ;;
      *) status=failed ;;
      esac
      note=$(grep -v '^[[:space:]]*$' "$W/logs/$p.log" | tail -1 | tr -d '"\\\000-\037' | cut -c1-200)
      echo "{\"call\":\"$call_id\",\"step\":\"$p\",\"status\":\"$status\",\"rc\":$rc,\"seconds\":$secs,\"note\":\"$note\"}" >>"$W/steps.jsonl"
      if [ $status = ok ]; then
        log "$p: ok in ${secs} s"
      else
        log "$p: $status (exit $rc) after ${secs} s; the log ends:"
        tail -15 "$W/logs/$p.log" | sed 's/^/    /'
      fi
      if [ "$p" = inventory ]; then grep -E '^(device|bundle|torch): ' "$W/logs/inventory.log" | sed 's/^/    /' || true; fi
    done
    finish
  done
  log "run.sh: done in $(($(date +%s) - started)) s"
  cat "$OUT/gpu-run.md" 2>/dev/null || true
}
main 2>&1 | tee -a "$OUT/run.log"
