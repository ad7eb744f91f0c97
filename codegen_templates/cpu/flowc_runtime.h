// Small helpers the generated pointwise expressions call.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace flowc {

// float16's storage type (c_type "flowc::half"): GCC's IEEE binary16.  Generated code never
// computes in it: compiler/passes/float16.py converts every float16 operand to float, computes in
// float and rounds the result to half on store (round to nearest even, overflow to infinity,
// NaN kept), which is what NumPy's float16 arithmetic does.
using half = _Float16;

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

// A uniform value in [0, 1) for element i of step `step` (flow.random.*): the same hash as
// dropout_keep, its top 24 bits times 2^-24, exact in float and double.
inline float random_unit(uint64_t seed, uint64_t step, uint64_t i) {
  uint64_t z = seed ^ (step * 0x9E3779B97F4A7C15ULL) ^ (i * 0xBF58476D1CE4E5B9ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return (float)(z >> 40) * (1.0f / 16777216.0f);
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

// --- math helpers of compiler/ops/math_rows.py (NumPy's semantics; the same text is in both
// codegen_templates/cpu/flowc_runtime.h and codegen_templates/cuda/flowc_cuda.h) ---

// np.abs: |x| with +0.0 for -0.0; the most negative integer stays itself (wraps, as in NumPy).
template <class T>
inline T abs(T x) {
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
inline T sign(T x) { return x > (T)0 ? (T)1 : x < (T)0 ? (T)-1 : x == (T)0 ? (T)0 : x; }

// np.floor_divide and np.mod: NumPy's divmod (the quotient rounded down, the remainder with the
// divisor's sign).  Floats: x // 0 is x / 0 and x % 0 is NaN; integers: both are 0 (NumPy's
// result, which it also warns about), and min // -1 wraps to min.
template <class T>
inline T floordiv(T a, T b) {
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
inline T mod(T a, T b) {
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
inline T softplus(T x) {
  return x != x ? x : (x > (T)0 ? x : (T)0) + std::log1p(std::exp(-std::fabs(x)));
}

// e^x for softmax's shifted values (x <= 0, or NaN), in a form GCC vectorises (std::exp is a call
// per element): Cody-Waite reduction x = n ln2 + r with |r| <= ln2 / 2, Cephes' degree-6 polynomial
// for e^r (within 2 ulp of float's e^x), and 2^n from exponent bits.  Below ln(FLT_MIN) the result is
// 0 (NumPy gives a subnormal there, under 1.2e-38), -inf gives 0, NaN stays NaN; x > 0 is not its
// domain.  The double overload is std::exp.  n is rounded with the 1.5 * 2^23 trick, not std::floor:
// GCC vectorises floor only under -fno-trapping-math, so a floor here kept every caller's loop scalar.
inline float exp_nonpositive(float x) {
  const float lo = -87.33654475f;                   // ln(FLT_MIN): 2^n stays a normal number
  const float xs = x >= lo ? x : lo;                // NaN -> lo here, so n is a valid int below
  const float n = (xs * 1.44269504089f + 12582912.0f) - 12582912.0f;     // nearest integer, |n| <= 126
  const float r = xs - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  const int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, sizeof scale);
  return x != x ? x : (x < lo ? 0.0f : e * scale);
}
inline double exp_nonpositive(double x) { return std::exp(x); }

// erf(x) for float in a form GCC vectorises (std::erf is a call per element), for gelu: x clamped
// to [-4, 4] (beyond it erf rounds to +-1 in float), then a rational minimax approximation, odd
// degree 13 over even degree 8 (the one Eigen and XLA use), within 4.5e-7 of erf everywhere.  NaN
// stays NaN (the clamp's comparisons are false for it), +-inf give +-1.  The double overload is std::erf.
inline float erf_vectorised(float x) {
  const float xc = x < -4.0f ? -4.0f : (x > 4.0f ? 4.0f : x);
  const float x2 = xc * xc;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 - 2.10102402082508e-06f;
  p = p * x2 - 5.69250639462346e-05f;
  p = p * x2 - 7.34990630326855e-04f;
  p = p * x2 - 2.95459980854025e-03f;
  p = p * x2 - 1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * x2 - 2.13374055278905e-04f;
  q = q * x2 - 1.68282697438203e-03f;
  q = q * x2 - 7.37332916720468e-03f;
  q = q * x2 - 1.42647390514189e-02f;
  return xc * p / q;
}
inline double erf_vectorised(double x) { return std::erf(x); }

// gelu(x) = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), OneFlow's exact form, and its gradient
// dy (Phi(x) + x phi(x)); the pdf's exponent is never positive (exp_nonpositive).  One call each in
// the generated loops and GEMM epilogues, which GCC then vectorises.
template <class T>
inline T gelu(T x) {
  return (T)0.5 * x * ((T)1 + erf_vectorised(x * (T)0.70710678118654752));
}
template <class T>
inline T gelu_grad(T x, T dy) {
  return dy * ((T)0.5 * ((T)1 + erf_vectorised(x * (T)0.70710678118654752)) +
               x * exp_nonpositive((T)-0.5 * x * x) * (T)0.39894228040143268);
}

// The digamma function psi(x) = d lgamma(x) / dx (the gradient of lgamma), in double: the
// reflection formula below 0, the recurrence up to 6, then the asymptotic series.  NaN at the
// poles (0, -1, -2, ...) and at -inf; +inf at +inf.  compiler/ops/math_rows.py's reference is
// the same algorithm in NumPy.
template <class T>
inline T digamma(T x_in) {
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
