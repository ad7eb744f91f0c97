// flowc_cuda.h -- helpers every generated CUDA translation unit includes.
//
// The op table's C++ expressions (compiler/ops/*.py, `c_expr`) are shared with the CPU backend:
// they call std::exp, std::numeric_limits<T>::infinity() (built with --expt-relaxed-constexpr)
// and flowc::dropout_keep, maximum, minimum, beats, cast and divide, which are defined here for the
// device with the same semantics (and the same bits) as codegen_templates/cpu/flowc_runtime.h.
#pragma once
#include <cstdint>
#include <cmath>
#include <limits>
#include <type_traits>

#define FLOWC_RESTRICT __restrict__

namespace flowc {

// Dropout's keep decision for element i of step `step`: splitmix64's finalizer over seed, step
// and index, exactly as on the CPU (and in the NumPy reference), so a mask is the same on
// every device.
__device__ __forceinline__ bool dropout_keep(uint64_t seed, uint64_t step, uint64_t i, uint32_t threshold) {
  uint64_t z = seed ^ (step * 0x9E3779B97F4A7C15ULL) ^ (i * 0xBF58476D1CE4E5B9ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return (uint32_t)(z >> 32) >= threshold;
}

// NaN-honest arithmetic with NumPy's semantics, as in codegen_templates/cpu/flowc_runtime.h
// (see there): comparisons only, exact without --use_fast_math (which flowc never uses).
template <class T>
__device__ __forceinline__ T maximum(T a, T b) { return (a > b || a != a) ? a : b; }
template <class T>
__device__ __forceinline__ T minimum(T a, T b) { return (a < b || a != a) ? a : b; }
template <class T>
__device__ __forceinline__ bool beats(T v, T best) { return v > best || (v != v && best == best); }

template <class To, class From>
__device__ __forceinline__ To cast(From x) {
  if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
    constexpr From past_max = (From)2 * (From)(std::numeric_limits<To>::max() / 2 + 1);
    constexpr From min = (From)std::numeric_limits<To>::min();
    return x != x ? (To)0 : x >= past_max ? std::numeric_limits<To>::max()
         : x < min ? std::numeric_limits<To>::min() : (To)x;
  } else {
    return (To)x;
  }
}

template <class T>
__device__ __forceinline__ T divide(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    if (b == 0) return 0;
    if constexpr (std::is_signed_v<T>) {
      if (b == -1) return (T)(0 - (std::make_unsigned_t<T>)a);
    }
  }
  return a / b;
}

// check_numerics: does an element of x[0, n) hold a NaN or an infinity?  x - x is 0 for every
// finite x and NaN otherwise (comparisons only, as on the CPU: flowc_runtime.h's any_non_finite).
// The first check of a step that finds one sets the status to its code; a later one keeps it.
template <class T, class I>
__device__ __forceinline__ void check_finite(const T* x, I n, int* status, int code) {
  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
    if ((x[i] - x[i]) != (T)0) {
      atomicCAS(status, 0, code);
      return;
    }
  }
}

// __shfl_xor_sync has no overloads for 8/16-bit types: shuffle those as int.
template <class T>
__device__ __forceinline__ T shfl_xor(T v, int lane_mask) {
  if constexpr (sizeof(T) < 4) {
    return (T)__shfl_xor_sync(0xffffffffu, (int)v, lane_mask);
  } else {
    return __shfl_xor_sync(0xffffffffu, v, lane_mask);
  }
}

// Butterfly reduction over the 32 lanes of a full warp; every lane gets the result.
template <class T, class Combine>
__device__ __forceinline__ T warp_reduce(T v, Combine combine) {
  for (int mask = 16; mask > 0; mask >>= 1) v = combine(v, shfl_xor(v, mask));
  return v;
}

// Reduction over a block whose size is a multiple of 32 (at most 1024); the result is valid in
// thread 0.  `identity` fills the lanes of warp 0 that have no partial.  Every thread of the
// block must call it (it synchronizes), and it may be called again right away.
template <class T, class Combine>
__device__ __forceinline__ T block_reduce(T v, T identity, Combine combine) {
  __shared__ T partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_reduce(v, combine);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < (int)(blockDim.x >> 5) ? partial[lane] : identity;
    v = warp_reduce(v, combine);
  }
  __syncthreads();   // partial[] is free again for the next call
  return v;
}

// A grid-stride loop's start and step.
__device__ __forceinline__ int64_t global_thread() { return (int64_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_threads() { return (int64_t)gridDim.x * blockDim.x; }

}  // namespace flowc
