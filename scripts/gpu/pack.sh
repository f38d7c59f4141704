#!/usr/bin/env bash
# Packs into gpu-pack/ (git-ignored) what a GPU run needs that git does not carry; the device tool
# sends it with `carry: ["gpu-pack"]` and scripts/gpu/run.sh unpacks it there. docs/gpu.md says how.
#   gpu-pack/bundle.tar.xz   mixprec + mixprec_tests built here for sm_90 (stripped, RUNPATH $ORIGIN/lib)
#                            with the libraries a non-Debian machine lacks: lib/ (oneDNN, OpenCL loader,
#                            libgomp, zlib), lib/compat/ (libstdc++, libgcc_s: used there only if its own
#                            are older). Not cuBLASLt/cuDNN/cudart: the machine has them (PyTorch's wheels).
#   gpu-pack/kit.tar.xz      the fallback source build: oneDNN, OpenCL, nlohmann-json and zlib headers with
#                            their CMake configs, GoogleTest's sources (the shared libraries: the bundle's)
#   gpu-pack/data/fashion-mnist/*.gz   Debian's dataset-fashion-mnist (mixprec train --data DIR)
#   gpu-pack/manifest.json   commit, versions built against, glibc/libstdc++ needed, sizes, timings
# Fails when the tree that travels (tracked + untracked-not-ignored files + gpu-pack/) exceeds 64 MiB.
#
# Usage: scripts/gpu/pack.sh [--no-build]   (--no-build: reuse build-gpupack/ as it is)
# Env:   PACK_BUDGET_MIB (64)  FASHION_MNIST_DIR (/usr/share/datasets/fashion-mnist)  XZ_OPT (-6 -T2)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
pack=$root/gpu-pack
build=$root/build-gpupack # ignored by /build*/: never travels
stage=$build/stage
budget_mib=${PACK_BUDGET_MIB:-64}
data_src=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
export XZ_OPT=${XZ_OPT:--6 -T2}
multiarch=x86_64-linux-gnu
t_start=$SECONDS
say() { echo "pack.sh: $*"; }
die() {
  echo "pack.sh: error: $*" >&2
  exit 1
}

[ "$(uname -m)" = x86_64 ] || die "this machine is $(uname -m); the GPU machine is x86-64: pack on an x86-64 machine"
git check-ignore -q gpu-pack/ || die "gpu-pack/ is not ignored by git (.gitignore): it would travel twice"

# 1. Build for Hopper alone. Build-tree binaries get the install RPATH, $ORIGIN/lib and nothing
# else (no absolute link directories), as DT_RPATH (--disable-new-dtags): a DT_RUNPATH would serve
# only the binaries' own needs, and libdnnl's libOpenCL would be looked for in the system alone.
# -ffile-prefix-map turns source paths in __FILE__ into relative ones. The tests' MIXPREC_SOURCE_DIR and MIXPREC_CLI defaults stay absolute: run.sh
# overrides both through the environment (tests/test_paths.h).
t0=$SECONDS
if [ "${1:-}" != --no-build ]; then
  mkdir -p "$build"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMIXPREC_WERROR=ON \
    -DMIXPREC_CUDA=ON -DMIXPREC_CUDA_ARCHS=90 \
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN/lib' '-DMIXPREC_RELOCATABLE_RPATH=$ORIGIN/lib' \
    -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags -DMIXPREC_MPI=OFF \
    "-DCMAKE_CXX_FLAGS=-ffile-prefix-map=$root/=" "-DCMAKE_CUDA_FLAGS=-Xcompiler=-ffile-prefix-map=$root/=" \
    >"$build/configure.log" 2>&1 || {
    cat "$build/configure.log" >&2
    die "configure failed"
  }
  cmake --build "$build" -j "${PACK_JOBS:-2}" --target mixprec_cli mixprec_tests
fi
t_build=$((SECONDS - t0))
for b in mixprec mixprec_tests; do [ -x "$build/$b" ] || die "$build/$b missing: build first"; done
readelf -d "$build/mixprec" | grep -q 'libcudart\|libcublasLt' ||
  die "$build/mixprec links no CUDA library: the CUDA backend is OFF in $build (see $build/configure.log)"

# 2. The bundle: binaries stripped, plus the non-glibc, non-CUDA libraries they load.
t0=$SECONDS
rm -rf "$stage" && mkdir -p "$stage/bundle/lib/compat" "$pack"
for b in mixprec mixprec_tests; do strip --strip-unneeded -o "$stage/bundle/$b" "$build/$b"; done
# ldd gives the whole closure (libdnnl's libOpenCL too). glibc comes from the machine (it cannot be
# swapped under a running loader); the CUDA libraries must match its driver, so they come from it too.
ldd "$build/mixprec" "$build/mixprec_tests" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
  while read -r soname path; do
    case $soname in
    libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | ld-linux*) ;;
    libcuda.so.* | libcudart.so.* | libcublas* | libcudnn* | libnvrtc* | libnvJitLink*) ;;
    libstdc++.so.* | libgcc_s.so.*) cp -L "$path" "$stage/bundle/lib/compat/$soname" ;;
    *) cp -L "$path" "$stage/bundle/lib/$soname" ;;
    esac
  done
compgen -G "$stage/bundle/lib/libdnnl.so*" >/dev/null || die "no libdnnl in the bundle: ldd found none"
# Every carried library must be the one the binaries load (RPATH reaches libdnnl's needs too).
for b in mixprec mixprec_tests; do
  for f in "$stage"/bundle/lib/*.so*; do
    got=$(LD_LIBRARY_PATH='' ldd "$stage/bundle/$b" | awk -v n="$(basename "$f")" '$1 == n { print $3 }')
    [ -z "$got" ] || [ "$got" -ef "$f" ] || die "$b loads $(basename "$f") from $got, not from the bundle's lib/"
  done
done

# What the machine must offer: the newest glibc and libstdc++ symbol versions anything here needs.
max_version() { # max_version PREFIX FILES...: highest PREFIX_x.y[.z] in the files' dynamic symbols
  local p=$1
  shift
  objdump -T "$@" 2>/dev/null | grep -o "${p}_[0-9][0-9.]*" | sed "s/${p}_//" | sort -uV | tail -1
}
glibc_needed=$(max_version GLIBC "$stage"/bundle/mixprec* "$stage"/bundle/lib/*.so*)
glibcxx_needed=$(max_version GLIBCXX "$stage"/bundle/mixprec* "$stage"/bundle/lib/*.so*)
# No absolute path of this machine may remain but the two overridable test defaults.
baked=$(strings "$stage"/bundle/mixprec* | grep -c "$root" || true)
tar -C "$stage" -cJf "$pack/bundle.tar.xz" bundle
t_bundle=$((SECONDS - t0))

# 3. The kit for a source build there. The CMake configs compute their prefix from their own
# location, so the Debian layout is kept under kit/prefix.
t0=$SECONDS
k=$stage/kit/prefix
mkdir -p "$k/include" "$k/lib/$multiarch/cmake" "$k/share/cmake"
cp -a /usr/include/oneapi /usr/include/dnnl*.h /usr/include/dnnl*.hpp /usr/include/CL /usr/include/nlohmann \
  /usr/include/zlib.h /usr/include/zconf.h "$k/include/"
cp -a /usr/lib/$multiarch/cmake/dnnl "$k/lib/$multiarch/cmake/"
cp -a /usr/share/cmake/nlohmann_json "$k/share/cmake/"
cp -a /usr/src/googletest "$stage/kit/googletest"
# The file name dnnl's CMake target expects (run.sh copies the bundle's libdnnl there under it).
dnnl_file=$(grep -o 'libdnnl\.so[0-9.]*' /usr/lib/$multiarch/cmake/dnnl/dnnl-targets-*.cmake | sed -n 1p | sed 's/.*://')
tar -C "$stage" -cJf "$pack/kit.tar.xz" kit
t_kit=$((SECONDS - t0))

# 4. The data, as Debian ships it (gzip idx: mixprec reads it directly).
t0=$SECONDS
mkdir -p "$pack/data/fashion-mnist"
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  [ -f "$data_src/$f.gz" ] || die "$data_src/$f.gz missing: apt-get install dataset-fashion-mnist (or FASHION_MNIST_DIR=...)"
  cp -u "$data_src/$f.gz" "$pack/data/fashion-mnist/"
done
t_data=$((SECONDS - t0))

# 5. Versions built against (run.sh compares them with what the machine has), then the budget.
cache=$build/CMakeCache.txt
cache_get() { sed -n "s/^$1:[A-Z]*=//p" "$cache"; }
cudnn_h=$(cache_get MIXPREC_CUDNN_INCLUDE)/cudnn_version.h
cublas_h=$(dirname "$(cache_get CUDA_cublasLt_LIBRARY)")/../include/cublas_api.h
[ -f "$cublas_h" ] || cublas_h=$(cache_get MIXPREC_CUDNN_INCLUDE)/cublas_api.h
hdr_version() { # hdr_version FILE MACRO_MAJOR MACRO_MINOR MACRO_PATCH
  local f=$1
  shift
  local v=()
  for m in "$@"; do v+=("$(sed -n "s/^#define $m \([0-9]*\).*/\1/p" "$f" | sed -n 1p)"); done
  (
    IFS=.
    echo "${v[*]}"
  )
}
cudnn_built=$(hdr_version "$cudnn_h" CUDNN_MAJOR CUDNN_MINOR CUDNN_PATCHLEVEL)
cublas_built=$(hdr_version "$cublas_h" CUBLAS_VER_MAJOR CUBLAS_VER_MINOR CUBLAS_VER_PATCH)
# cmake/cuda.cmake sets the compiler as a plain variable: CMake records it per CMake version.
nvcc=$(sed -n 's/^set(CMAKE_CUDA_COMPILER "\(.*\)")$/\1/p' "$build"/CMakeFiles/*/CMakeCUDACompiler.cmake | sed -n 1p)
nvcc_built=$("${nvcc:-nvcc}" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')

repo_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null |
  awk '{ s += $1 } END { print s + 0 }')
[ -d shared ] && repo_bytes=$((repo_bytes + $(du -sb --apparent-size shared | cut -f1)))
pack_bytes=$(du -sb --apparent-size "$pack" | cut -f1)
total=$((repo_bytes + pack_bytes))
limit=$((budget_mib * 1024 * 1024))

python3 - "$pack/manifest.json" <<EOF
import json, sys
json.dump({
  "commit": "$(git rev-parse HEAD)", "dirty": $([ -z "$(git status --porcelain -uno)" ] && echo False || echo True),
  "packed_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "packed_on": "$(. /etc/os-release && echo "$PRETTY_NAME")",
  "cuda_archs": "90", "nvcc": "$nvcc_built", "cudnn": "$cudnn_built", "cublaslt": "$cublas_built",
  "glibc_needed": "$glibc_needed", "glibcxx_needed": "$glibcxx_needed",
  "bundle_libs": sorted("$(cd "$stage/bundle/lib" && find . -type f | sed 's|^\./||' | tr '\n' ' ')".split()),
  "dnnl_file": "$dnnl_file", "multiarch": "$multiarch",
  "absolute_paths_in_binaries": $baked,
  "bytes": {"repo": $repo_bytes, "gpu_pack": $pack_bytes, "total": $total, "limit": $limit,
            "bundle_xz": $(stat -c %s "$pack/bundle.tar.xz"), "kit_xz": $(stat -c %s "$pack/kit.tar.xz"),
            "data": $(du -sb --apparent-size "$pack/data" | cut -f1)},
  "seconds": {"build": $t_build, "bundle": $t_bundle, "kit": $t_kit, "data": $t_data, "total": $((SECONDS - t_start))},
}, open(sys.argv[1], "w"), indent=1)
EOF

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
say "built against nvcc $nvcc_built, cuDNN $cudnn_built, cuBLASLt $cublas_built; needs glibc >= $glibc_needed, GLIBCXX $glibcxx_needed (lib/compat has ours)"
say "bundle $(mib "$(stat -c %s "$pack/bundle.tar.xz")"), kit $(mib "$(stat -c %s "$pack/kit.tar.xz")"), data $(mib "$(du -sb --apparent-size "$pack/data" | cut -f1)")"
say "strings with this checkout's path left in the binaries: $baked (the tests' MIXPREC_SOURCE_DIR/MIXPREC_CLI defaults; run.sh overrides them)"
say "travels: repo $(mib "$repo_bytes") + gpu-pack $(mib "$pack_bytes") = $(mib "$total") of $(mib "$limit")"
say "took $((SECONDS - t_start)) s (build $t_build s, bundle $t_bundle s, kit $t_kit s, data $t_data s)"
((total <= limit)) || die "over the device tool's budget by $(mib $((total - limit))): leave something out"
