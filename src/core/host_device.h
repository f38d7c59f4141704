// MIXPREC_HOST_DEVICE: marks a function that nvcc compiles for both the host and the GPU (and that
// a plain C++ compiler sees as an ordinary inline function), so CPU and CUDA kernels share one
// formula instead of two copies.
#pragma once

#ifdef __CUDACC__
#define MIXPREC_HOST_DEVICE __host__ __device__
#else
#define MIXPREC_HOST_DEVICE
#endif
