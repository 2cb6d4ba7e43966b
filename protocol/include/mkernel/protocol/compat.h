// compat.h: the few macros that let protocol headers compile under g++, clang and nvcc alike,
// without the CUDA runtime headers.
#pragma once

#if defined(__CUDACC__)
#define MK_HOST_DEVICE __host__ __device__
#define MK_DEVICE __device__
#else
#define MK_HOST_DEVICE
#define MK_DEVICE
#endif

#if defined(__CUDA_ARCH__)
#define MK_DEVICE_PASS 1
#else
#define MK_DEVICE_PASS 0
#endif
