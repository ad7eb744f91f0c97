// Small helpers the generated pointwise expressions call.
#pragma once
#include <cstdint>
#include <limits>
#include <type_traits>

namespace flowc {

// Dropout's keep decision for element i of step `step`: a counter-based hash (splitmix64's
// finalizer over seed, step and index), so the mask needs no state, is the same in every run
// with the same seed, and the NumPy reference computes the very same bits.
inline bool dropout_keep(uint64_t seed, uint64_t step, uint64_t i, uint32_t threshold) {
  uint64_t z = seed ^ (step * 0x9E3779B97F4A7C15ULL) ^ (i * 0xBF58476D1CE4E5B9ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return (uint32_t)(z >> 32) >= threshold;
}

// Is a label outside [0, classes)?  The step checks its input labels with it before any kernel
// runs, so a step that fails on one changes nothing.
template <class L>
inline bool any_out_of_range(const L* labels, int64_t n, int64_t classes) {
  bool bad = false;
  for (int64_t r = 0; r < n; ++r) bad |= (int64_t)labels[r] < 0 || (int64_t)labels[r] >= classes;
  return bad;
}

// Is an element NaN or an infinity?  check_numerics scans each kernel's float outputs with it.
// x - x is 0 for every finite x and NaN otherwise: comparisons only, as below, and the same test
// as the device's in codegen_templates/cuda/flowc_cuda.h.
template <class T>
inline bool any_non_finite(const T* x, int64_t n) {
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) bad |= (x[i] - x[i]) != (T)0;
  return bad;
}

// NaN-honest arithmetic, NumPy's semantics (the NumPy reference executor is the oracle; the same
// helpers are in codegen_templates/cuda/flowc_cuda.h for the device).  Written with comparisons
// only, so they stay exact without -ffast-math (which flowc never uses: it breaks `x != x`).

// np.maximum: a NaN operand wins (the first one if both are); on ties (-0.0, +0.0) the second.
template <class T>
inline T maximum(T a, T b) { return (a > b || a != a) ? a : b; }

// np.minimum: the same with the comparison reversed.
template <class T>
inline T minimum(T a, T b) { return (a < b || a != a) ? a : b; }

// Does `v` replace `best` as a row's running first maximum?  np.argmax's order: the first NaN
// wins over everything, otherwise the first of equal maxima stays.
template <class T>
inline bool beats(T v, T best) { return v > best || (v != v && best == best); }

// Conversion between element types.  Float to integer is saturating, NaN to 0 (what the GPU
// does natively; C++ leaves it undefined, and NumPy's result differs between x86 and ARM);
// every other conversion is C++'s own.
template <class To, class From>
inline To cast(From x) {
  if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
    // 2^digits of To, exactly representable in From: the first value past To's maximum.
    constexpr From past_max = (From)2 * (From)(std::numeric_limits<To>::max() / 2 + 1);
    constexpr From min = (From)std::numeric_limits<To>::min();
    return x != x ? (To)0 : x >= past_max ? std::numeric_limits<To>::max()
         : x < min ? std::numeric_limits<To>::min() : (To)x;
  } else {
    return (To)x;
  }
}

// Division; an integer divided by 0 is 0 (instead of SIGFPE killing the process), and the one
// overflowing quotient, min / -1, wraps to min as NumPy's does.
template <class T>
inline T divide(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    if (b == 0) return 0;
    if constexpr (std::is_signed_v<T>) {
      if (b == -1) return (T)(0 - (std::make_unsigned_t<T>)a);
    }
  }
  return a / b;
}

}  // namespace flowc
