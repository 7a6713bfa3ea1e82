// Vector helpers of cpu_paged_decode.cpp: L floats as one GCC vector, loads from the
// cache's dtypes, folding L dot products at once, e^x and a softmax's exponentiation.
// Header-only: cpu_decode_kernel.py copies it beside the source and hashes it into the
// build key.
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

// inlined into each per-ISA entry point below, so they are compiled for its target too
#define OMNI_INLINE __attribute__((always_inline)) inline

// L floats as one GCC vector (one register of the ISA that instantiates it). Lanes are
// explicit, so the compiler vectorizes without -ffast-math.
template <int L>
struct Lanes {
  typedef float Vec __attribute__((vector_size(4 * L)));
  typedef int32_t Index __attribute__((vector_size(4 * L)));
  typedef uint16_t Bits __attribute__((vector_size(2 * L)));
  typedef uint32_t Word __attribute__((vector_size(4 * L)));
};

template <int L, typename T>
OMNI_INLINE typename Lanes<L>::Vec load(const T* p) {  // float16: one value at a time
  float values[L];
  for (int j = 0; j < L; ++j) values[j] = static_cast<float>(p[j]);
  typename Lanes<L>::Vec out;
  std::memcpy(&out, values, sizeof(out));
  return out;
}

template <int L>
OMNI_INLINE typename Lanes<L>::Vec load(const float* p) {
  typename Lanes<L>::Vec out;
  std::memcpy(&out, p, sizeof(out));
  return out;
}

template <int L>
OMNI_INLINE typename Lanes<L>::Vec load(const c10::BFloat16* p) {  // float's top half
  typename Lanes<L>::Bits bits;
  std::memcpy(&bits, p, sizeof(bits));
  const auto wide = __builtin_convertvector(bits, typename Lanes<L>::Word) << 16;
  typename Lanes<L>::Vec out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}

// Lane j of the result = the sum of part[j]'s lanes: L dot products folded at once. Each
// level pairs up vectors and keeps, of each pair, the first half of every lane group in
// `lo` and the second half in `hi`; their sum halves the groups. L - 1 pairs in all, where
// folding each dot on its own took ~10 dependent instructions per dot.
template <int L>
OMNI_INLINE typename Lanes<L>::Vec fold(typename Lanes<L>::Vec* part) {  // overwrites part
  typedef typename Lanes<L>::Index Index;
  for (int group = L, count = L; group > 1; group /= 2, count /= 2) {
    const int half = group / 2;
    Index lo;
    for (int i = 0; i < L / 2; ++i) {
      lo[i] = i / half * group + i % half;
      lo[i + L / 2] = lo[i] + L;
    }
    const Index hi = lo + half;
    for (int i = 0; i < count / 2; ++i) {
      part[i] = __builtin_shuffle(part[2 * i], part[2 * i + 1], lo) +
                __builtin_shuffle(part[2 * i], part[2 * i + 1], hi);
    }
  }
  return part[0];
}

// e^x for x in [-87, 0] (scores less their maximum), L lanes at once: x = n ln2 + r with n
// an integer and |r| <= ln2 / 2 (ln2 in two parts, so r keeps its low bits), e^r by its
// Taylor series to r^6 (relative error below 2e-7 there), times 2^n built in the exponent
// bits. glibc's expf one value at a time was most of a call's arithmetic: a softmax weight
// per context position and query head (bench/results/cpu-decode-attention.md).
template <int L>
OMNI_INLINE typename Lanes<L>::Vec exp_lanes(typename Lanes<L>::Vec x) {
  typedef typename Lanes<L>::Vec Vec;
  typedef typename Lanes<L>::Index Index;
  const Vec low = Vec{} - 87.0f;
  x = x < low ? low : x;  // e^-87 ~ 1.6e-38: still a normal float
  const Vec shift = Vec{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const Vec n = (x * 1.44269504f + shift) - shift;
  const Vec r = (x - n * 0.693145752f) - n * 1.42860677e-06f;
  Vec e = Vec{} + (1.0f / 720);
  e = e * r + (1.0f / 120);
  e = e * r + (1.0f / 24);
  e = e * r + (1.0f / 6);
  e = e * r + 0.5f;
  e = e * r + 1.0f;
  e = e * r + 1.0f;
  const Index bits = (__builtin_convertvector(n, Index) + 127) << 23;  // 2^n
  Vec scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return e * scale;
}

// scores -> unnormalised softmax weights in place; returns their sum
template <int L>
OMNI_INLINE float exponentiate(float* scores, int64_t n) {
  typedef typename Lanes<L>::Vec Vec;
  const float top = *std::max_element(scores, scores + n);
  Vec sums{};
  int64_t p = 0;
  for (; p + L <= n; p += L) {
    const Vec e = exp_lanes<L>(load<L>(scores + p) - top);
    std::memcpy(scores + p, &e, sizeof(e));
    sums += e;
  }
  float sum = 0.0f;
  for (int j = 0; j < L; ++j) sum += sums[j];
  for (; p < n; ++p) {
    scores[p] = std::exp(scores[p] - top);
    sum += scores[p];
  }
  return sum;
}
