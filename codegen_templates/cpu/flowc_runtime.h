// Small helpers the generated pointwise expressions call.
#pragma once
#include <cstdint>

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

}  // namespace flowc
