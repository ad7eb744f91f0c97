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
#ifndef FLOWC_CUDA_EMULATOR
#include <cuda_fp16.h>
#endif

#define FLOWC_RESTRICT __restrict__

namespace flowc {

// float16's storage type (c_type "flowc::half"), converted to and from float only (by `cast`):
// compiler/passes/float16.py makes every float16 op compute in float and round on store.
using half = __half;

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

// A uniform value in [0, 1) for element i of step `step` (flow.random.*): the same hash as
// dropout_keep, its top 24 bits times 2^-24, exact in float and double.
__device__ __forceinline__ float random_unit(uint64_t seed, uint64_t step, uint64_t i) {
  uint64_t z = seed ^ (step * 0x9E3779B97F4A7C15ULL) ^ (i * 0xBF58476D1CE4E5B9ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return (float)(z >> 40) * (1.0f / 16777216.0f);
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

// --- math helpers of compiler/ops/math_rows.py (NumPy's semantics; the same text is in both
// codegen_templates/cpu/flowc_runtime.h and codegen_templates/cuda/flowc_cuda.h) ---

// np.abs: |x| with +0.0 for -0.0; the most negative integer stays itself (wraps, as in NumPy).
template <class T>
__host__ __device__ __forceinline__ T abs(T x) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::fabs(x);
  } else if constexpr (std::is_signed_v<T>) {
    return x < 0 ? (T)(0 - (std::make_unsigned_t<T>)x) : x;
  } else {
    return x;
  }
}

// np.sign: -1, 0 (+0.0 for either zero) or 1; NaN stays NaN.
template <class T>
__host__ __device__ __forceinline__ T sign(T x) { return x > (T)0 ? (T)1 : x < (T)0 ? (T)-1 : x == (T)0 ? (T)0 : x; }

// np.floor_divide and np.mod: NumPy's divmod (the quotient rounded down, the remainder with the
// divisor's sign).  Floats: x // 0 is x / 0 and x % 0 is NaN; integers: both are 0 (NumPy's
// result, which it also warns about), and min // -1 wraps to min.
template <class T>
__host__ __device__ __forceinline__ T floordiv(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (b == (T)0) return a / b;
    T mod = std::fmod(a, b);
    T div = (a - mod) / b;
    if (mod != (T)0) {
      if ((b < (T)0) != (mod < (T)0)) div -= (T)1;
    }
    if (div != (T)0) {
      T floor_div = std::floor(div);
      if (div - floor_div > (T)0.5) floor_div += (T)1;
      return floor_div;
    }
    return std::copysign((T)0, a / b);
  } else {
    if (b == 0) return 0;
    if constexpr (std::is_signed_v<T>) {
      if (b == -1) return (T)(0 - (std::make_unsigned_t<T>)a);
      T q = a / b;
      if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
      return q;
    } else {
      return a / b;
    }
  }
}

template <class T>
__host__ __device__ __forceinline__ T mod(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    T m = std::fmod(a, b);
    if (b == (T)0) return m;
    if (m != (T)0) {
      if ((b < (T)0) != (m < (T)0)) m += b;
    } else {
      m = std::copysign((T)0, b);
    }
    return m;
  } else {
    if (b == 0) return 0;
    if constexpr (std::is_signed_v<T>) {
      if (b == -1) return 0;
      T m = a % b;
      if (m != 0 && ((m < 0) != (b < 0))) m += b;
      return m;
    } else {
      return a % b;
    }
  }
}

// log(1 + e^x) without overflow (np.logaddexp(0, x)): max(x, 0) + log1p(e^-|x|).
template <class T>
__host__ __device__ __forceinline__ T softplus(T x) {
  return x != x ? x : (x > (T)0 ? x : (T)0) + std::log1p(std::exp(-std::fabs(x)));
}

// gelu(x) = 0.5 x (1 + erf(x / sqrt 2)) and its gradient dy (Phi(x) + x phi(x)), named as the CPU
// header names them (the pointwise rows call flowc::gelu / flowc::gelu_grad); here erf and exp are
// CUDA's own.
template <class T>
__host__ __device__ __forceinline__ T gelu(T x) {
  return (T)0.5 * x * ((T)1 + std::erf(x * (T)0.70710678118654752));
}
template <class T>
__host__ __device__ __forceinline__ T gelu_grad(T x, T dy) {
  return dy * ((T)0.5 * ((T)1 + std::erf(x * (T)0.70710678118654752)) +
               x * std::exp((T)-0.5 * x * x) * (T)0.39894228040143268);
}

// The digamma function psi(x) = d lgamma(x) / dx (the gradient of lgamma), in double: the
// reflection formula below 0, the recurrence up to 6, then the asymptotic series.  NaN at the
// poles (0, -1, -2, ...) and at -inf; +inf at +inf.  compiler/ops/math_rows.py's reference is
// the same algorithm in NumPy.
template <class T>
__host__ __device__ __forceinline__ T digamma(T x_in) {
  double x = (double)x_in, result = 0.0;
  if (x != x || x == -std::numeric_limits<double>::infinity()) return (T)NAN;
  if (x == std::numeric_limits<double>::infinity()) return x_in;
  if (x <= 0.0) {
    if (x == std::floor(x)) return (T)NAN;
    const double pi = 3.14159265358979323846;
    result = -pi / std::tan(pi * x);
    x = 1.0 - x;
  }
  while (x < 6.0) {
    result -= 1.0 / x;
    x += 1.0;
  }
  const double r = 1.0 / (x * x);
  result += std::log(x) - 0.5 / x
            - r * (1.0 / 12 - r * (1.0 / 120 - r * (1.0 / 252 - r * (1.0 / 240 - r * (1.0 / 132)))));
  return (T)result;
}

}  // namespace flowc
