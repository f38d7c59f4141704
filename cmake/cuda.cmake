# Decides MIXPREC_CUDA: ON only where a CUDA 12+ toolkit, cuBLASLt and cuDNN 9 are found and a test
# program using all three compiles and links; OFF otherwise, with one line saying why. A user's Debian
# without CUDA configures exactly as before.
#   -DMIXPREC_CUDA=AUTO|ON|OFF   AUTO (default): as found; ON: fail configuring if not found
#   -DMIXPREC_CUDA_ARCHS=...     CMAKE_CUDA_ARCHITECTURES to build (default below; CI and GPU runs: 90)
set(MIXPREC_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO, ON or OFF")
set_property(CACHE MIXPREC_CUDA PROPERTY STRINGS AUTO ON OFF)
# Ampere to Hopper as machine code, plus sm_90's PTX so a newer GPU can JIT it.
set(MIXPREC_CUDA_ARCHS "80-real;86-real;89-real;90" CACHE STRING "CUDA architectures for the CUDA backend")

function(mixprec_cuda_off why)
  if(MIXPREC_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MIXPREC_CUDA=ON but ${why}")
  endif()
  message(STATUS "mixprec: CUDA backend OFF: ${why}")
  set(MIXPREC_CUDA_ENABLED OFF PARENT_SCOPE)
endfunction()

set(MIXPREC_CUDA_ENABLED OFF)
if(MIXPREC_CUDA STREQUAL "OFF")
  message(STATUS "mixprec: CUDA backend OFF: MIXPREC_CUDA=OFF")
  return()
endif()

include(CheckLanguage)
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)  # the toolkit's usual place, when not on PATH
endif()
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  mixprec_cuda_off("no CUDA compiler (nvcc) found")
  return()
endif()

# CMake 3.25.1's FindCUDAToolkit (Debian 12's) runs set_property on CUDA::nvToolsExt, which CUDA 13
# no longer ships, when the project's minimum is 3.25 ("set_property could not find TARGET
# CUDA::nvToolsExt", seen in a brand-new root): with the minimum read as 3.24 it skips that step.
set(_mixprec_cmake_minimum ${CMAKE_MINIMUM_REQUIRED_VERSION})
set(CMAKE_MINIMUM_REQUIRED_VERSION 3.24)
find_package(CUDAToolkit QUIET)
set(CMAKE_MINIMUM_REQUIRED_VERSION ${_mixprec_cmake_minimum})
if(NOT CUDAToolkit_FOUND)
  mixprec_cuda_off("nvcc at ${CMAKE_CUDA_COMPILER}, but no CUDA toolkit libraries beside it")
  return()
endif()
if(CUDAToolkit_VERSION VERSION_LESS 12)
  mixprec_cuda_off("CUDA ${CUDAToolkit_VERSION} found, 12 or newer needed")
  return()
endif()
if(NOT TARGET CUDA::cublasLt)
  mixprec_cuda_off("CUDA ${CUDAToolkit_VERSION} has no cuBLASLt")
  return()
endif()

# cuDNN is not part of CUDAToolkit's targets: look beside the toolkit, then in the system.
find_path(MIXPREC_CUDNN_INCLUDE cudnn_version.h HINTS ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
find_library(MIXPREC_CUDNN_LIB cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib)
if(NOT MIXPREC_CUDNN_INCLUDE OR NOT MIXPREC_CUDNN_LIB)
  mixprec_cuda_off("CUDA ${CUDAToolkit_VERSION} found, but no cuDNN (cudnn_version.h, libcudnn)")
  return()
endif()
file(STRINGS ${MIXPREC_CUDNN_INCLUDE}/cudnn_version.h _cudnn_major REGEX "^#define CUDNN_MAJOR [0-9]+")
string(REGEX REPLACE ".* ([0-9]+)$" "\\1" _cudnn_major "${_cudnn_major}")
if(NOT _cudnn_major OR _cudnn_major LESS 9)
  mixprec_cuda_off("cuDNN ${_cudnn_major} found in ${MIXPREC_CUDNN_INCLUDE}, 9 or newer needed")
  return()
endif()

# The test compile: a .cu that calls the runtime, cuBLASLt and cuDNN, built for one architecture.
enable_language(CUDA)
set(_probe_dir ${CMAKE_BINARY_DIR}/cuda_probe)
file(WRITE ${_probe_dir}/probe.cu [=[
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
__global__ void probe_kernel(float* dst) { dst[threadIdx.x] = 1.0f; }
int main() {
  int n = 0;
  cublasLtHandle_t lt = nullptr;
  // Never run, only linked: each call must resolve against the libraries found.
  return cudaGetDeviceCount(&n) == cudaSuccess && cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS &&
                 cudnnGetVersion() > 0 ? 0 : 1;
}
]=])
try_compile(_probe_ok ${_probe_dir}/build SOURCES ${_probe_dir}/probe.cu
            CMAKE_FLAGS "-DCMAKE_CUDA_ARCHITECTURES=90" "-DINCLUDE_DIRECTORIES=${MIXPREC_CUDNN_INCLUDE}"
            LINK_LIBRARIES CUDA::cudart CUDA::cublasLt ${MIXPREC_CUDNN_LIB}
            OUTPUT_VARIABLE _probe_log)
if(NOT _probe_ok)
  file(WRITE ${_probe_dir}/probe.log "${_probe_log}")
  mixprec_cuda_off("a test program using CUDA ${CUDAToolkit_VERSION}, cuBLASLt and cuDNN ${_cudnn_major} did not build (log: ${_probe_dir}/probe.log)")
  return()
endif()

set(CMAKE_CUDA_ARCHITECTURES ${MIXPREC_CUDA_ARCHS})
# CMake 3.25 (Debian 12's) knows no C++20 flag for nvcc ("requires the language dialect CUDA20",
# seen once the first .cu file joined the library); nvcc 12 and newer take -std=c++20.
if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(MIXPREC_CUDA_ENABLED ON)
message(STATUS "mixprec: CUDA backend ON: CUDA ${CUDAToolkit_VERSION}, cuDNN ${_cudnn_major} "
               "(${MIXPREC_CUDNN_LIB}), architectures ${CMAKE_CUDA_ARCHITECTURES}")
