// Compiler glue: the macros that let one function body run in a CUDA kernel and in a
// host loop compiled by a plain C++ compiler.
#pragma once

#if defined(__CUDACC__)
/// Marks a function callable from host and device code under nvcc; plain `inline`
/// under a host compiler, so codec code is unit-tested by g++ without a GPU.
#define LOWBIT_HD __host__ __device__ __forceinline__
/// True while nvcc compiles the device side of a translation unit.
#define LOWBIT_CUDA 1
#else
#define LOWBIT_HD inline
#define LOWBIT_CUDA 0
#endif

#if defined(__CUDA_ARCH__)
#define LOWBIT_DEVICE_PASS 1
#else
#define LOWBIT_DEVICE_PASS 0
#endif

/// Asks the compiler to unroll the next loop fully (nvcc) or up to 32 times (GCC), so
/// that constant-indexed arrays in the codec stay in registers.
#if defined(__CUDA_ARCH__)
#define LOWBIT_UNROLL _Pragma("unroll")
#elif defined(__CUDACC__)  // nvcc's host pass: its front end rejects the GCC spelling
#define LOWBIT_UNROLL
#elif defined(__clang__)
#define LOWBIT_UNROLL _Pragma("clang loop unroll(full)")
#elif defined(__GNUC__)
#define LOWBIT_UNROLL _Pragma("GCC unroll 32")
#else
#define LOWBIT_UNROLL
#endif

#if defined(__has_include)
#if __has_include(<cuda_fp16.h>) && __has_include(<cuda_bf16.h>)
/// 1 when the CUDA half-precision types are available (they are in host code too).
#define LOWBIT_HAS_CUDA_HALF 1
#endif
#endif
#ifndef LOWBIT_HAS_CUDA_HALF
#define LOWBIT_HAS_CUDA_HALF 0
#endif

namespace lowbit {

/// Always false, but only once instantiated: the operand of a `static_assert` that
/// turns "no specialisation for this policy" into one readable sentence.
template <class...>
inline constexpr bool dependent_false = false;

}  // namespace lowbit
