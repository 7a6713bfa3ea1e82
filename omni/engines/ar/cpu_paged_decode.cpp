// A decode step's attention on the CPU, reading the paged KV cache in place.
//
// The portable path (paged_attention._sdpa_decode) copies every sequence's K and V rows
// out of the cache into a padded tensor and then lets SDPA read them again; this reads
// each cached row once, straight from its slot, and stops at each sequence's length.
// One task per (sequence, KV head): the query heads that share a KV head are scored
// against each K row while it is in cache. Two passes: scores, then softmax weights times
// V rows, accumulated in float32 whatever the cache's dtype.
//
// Built by cpu_decode_kernel.py (g++ with torch's include paths, portable flags: no
// -march=native: the build is cached and may be reused on another CPU). Only light
// headers, so the first build takes seconds, not the half minute torch/extension.h takes.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

// independent partial sums, so the compiler vectorizes the dot product without
// -ffast-math (one running sum fixes the order of the additions)
constexpr int64_t kLanes = 16;

// inlined into each multi-versioned task below, so they are compiled for its target too
#define OMNI_INLINE __attribute__((always_inline)) inline

OMNI_INLINE float dot(const float* a, const float* b, int64_t n) {
  float part[kLanes] = {0.0f};
  int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) part[j] += a[d + j] * b[d + j];
  }
  // fold the lanes pairwise: a serial sum of 16 lanes was the dot's longest chain
  for (int64_t j = 0; j < 8; ++j) part[j] += part[j + 8];
  for (int64_t j = 0; j < 4; ++j) part[j] += part[j + 4];
  float sum = (part[0] + part[2]) + (part[1] + part[3]);
  for (; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

OMNI_INLINE void add_scaled(float* acc, float weight, const float* row, int64_t n) {
  for (int64_t d = 0; d < n; ++d) acc[d] += weight * row[d];
}

// a cached row as float32: float rows are read where they lie, others converted once
template <typename T>
OMNI_INLINE const float* as_float(const T* row, float* scratch, int64_t n) {
  for (int64_t d = 0; d < n; ++d) scratch[d] = static_cast<float>(row[d]);
  return scratch;
}

template <>
OMNI_INLINE const float* as_float<float>(const float* row, float*, int64_t) {
  return row;
}

struct Shapes {
  int64_t heads, kv_heads, group, dim, width, num_slots;
  float scale;
  int64_t window;
};

template <typename T>
struct Views {
  const T* q;
  const T* k;
  const T* v;
  const int64_t* slots;
  const int64_t* lens;
  T* out;
  int64_t q_head, q_batch, k_slot, k_head, v_slot, v_head, slots_row;
};

// scratch of one worker, reused across its tasks
struct Scratch {
  std::vector<float> query, scores, acc, row, total;
};

template <typename T>
OMNI_INLINE void attend_one(const Views<T>& t, const Shapes& s, int64_t b, int64_t g, Scratch& w) {
  const int64_t len = t.lens[b];
  TORCH_CHECK(len >= 1 && len <= s.width, "paged_decode: length ", len,
              " outside [1, ", s.width, "] for sequence ", b);
  const int64_t start = s.window > 0 ? std::max<int64_t>(0, len - s.window) : 0;
  const int64_t n = len - start, G = s.group, D = s.dim;
  w.query.resize(G * D);
  w.scores.resize(G * n);
  w.acc.assign(G * D, 0.0f);
  w.row.resize(D);
  w.total.resize(G);
  for (int64_t h = 0; h < G; ++h) {
    const T* src = t.q + (g * G + h) * t.q_head + b * t.q_batch;
    for (int64_t d = 0; d < D; ++d) w.query[h * D + d] = static_cast<float>(src[d]);
  }
  const int64_t* slots = t.slots + b * t.slots_row + start;
  for (int64_t p = 0; p < n; ++p) {
    const int64_t slot = slots[p];
    TORCH_CHECK(slot >= 0 && slot < s.num_slots, "paged_decode: slot ", slot, " out of range");
    const float* key = as_float(t.k + slot * t.k_slot + g * t.k_head, w.row.data(), D);
    for (int64_t h = 0; h < G; ++h) {
      w.scores[h * n + p] = dot(w.query.data() + h * D, key, D) * s.scale;
    }
  }
  for (int64_t h = 0; h < G; ++h) {
    float* score = w.scores.data() + h * n;
    const float top = *std::max_element(score, score + n);
    float sum = 0.0f;
    for (int64_t p = 0; p < n; ++p) {
      score[p] = std::exp(score[p] - top);
      sum += score[p];
    }
    w.total[h] = sum;
  }
  for (int64_t p = 0; p < n; ++p) {
    const float* value = as_float(t.v + slots[p] * t.v_slot + g * t.v_head, w.row.data(), D);
    for (int64_t h = 0; h < G; ++h) {
      add_scaled(w.acc.data() + h * D, w.scores[h * n + p], value, D);
    }
  }
  for (int64_t h = 0; h < G; ++h) {
    T* dst = t.out + (b * s.heads + g * G + h) * D;
    const float inv = 1.0f / w.total[h];
    for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<T>(w.acc[h * D + d] * inv);
  }
}

// The task's loops compiled for x86-64-v4 (AVX-512), v3 (AVX2) and the baseline, picked
// when the library loads (GCC function multi-versioning): a portable build that still uses
// the wide vectors of the CPU it runs on. The arithmetic is the same in every version:
// no FMA contraction (ISO C++ mode) and the lanes of dot() are explicit, so the results
// are bit-identical whichever runs.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define OMNI_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define OMNI_CLONES
#endif

template <typename T>
struct Task;

#define OMNI_TASK(T)                                                                      \
  template <>                                                                             \
  struct Task<T> {                                                                        \
    OMNI_CLONES static void run(const Views<T>& t, const Shapes& s, int64_t b, int64_t g, \
                                Scratch& w) {                                             \
      attend_one<T>(t, s, b, g, w);                                                       \
    }                                                                                     \
  };
OMNI_TASK(float)
OMNI_TASK(c10::BFloat16)
OMNI_TASK(c10::Half)

template <typename T>
void attend_all(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& slots, const at::Tensor& lens, at::Tensor& out,
                const Shapes& s) {
  const Views<T> t{q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(),
                   slots.data_ptr<int64_t>(), lens.data_ptr<int64_t>(), out.data_ptr<T>(),
                   q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
                   v.stride(1), slots.stride(0)};
  const int64_t batch = q.size(1);
  // a task is (sequence, KV head); split only where a task is worth a thread's wake-up
  const int64_t work = std::max<int64_t>(1, s.group * s.dim * s.width);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / work);
  at::parallel_for(0, batch * s.kv_heads, grain, [&](int64_t begin, int64_t end) {
    Scratch scratch;
    for (int64_t task = begin; task < end; ++task) {
      Task<T>::run(t, s, task / s.kv_heads, task % s.kv_heads, scratch);
    }
  });
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& slots, const at::Tensor& lens, const at::Tensor& out) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3,
              "paged_decode: q (H, B, D), caches (slots, KVH, D)");
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu(), "paged_decode: CPU tensors only");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type() &&
                  out.scalar_type() == q.scalar_type(),
              "paged_decode: q, caches and out must share a dtype");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1 && v.stride(2) == 1 && out.is_contiguous(),
              "paged_decode: rows must be contiguous over D");
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(2) == q.size(2),
              "paged_decode: cache shapes differ from q's head_dim");
  TORCH_CHECK(q.size(0) % k.size(1) == 0, "paged_decode: heads not a multiple of KV heads");
  TORCH_CHECK(slots.scalar_type() == at::kLong && lens.scalar_type() == at::kLong &&
                  slots.dim() == 2 && slots.stride(1) == 1 && lens.is_contiguous() &&
                  slots.size(0) == q.size(1) && lens.numel() == q.size(1),
              "paged_decode: slots (B, W) and lens (B,) int64");
  TORCH_CHECK(out.size(0) == q.size(1) && out.size(1) == q.size(0) && out.size(2) == q.size(2),
              "paged_decode: out must be (B, H, D)");
}

// q (H, B, D), k/v cache (slots, KVH, D), slots (B, W), lens (B,) -> out (B, H, D)
void paged_decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& slots, const at::Tensor& lens, double scale,
                  int64_t window, at::Tensor out) {
  check_inputs(q, k, v, slots, lens, out);
  const Shapes s{q.size(0), k.size(1), q.size(0) / k.size(1), q.size(2), slots.size(1),
                 k.size(0), static_cast<float>(scale), window};
  switch (q.scalar_type()) {
    case at::kFloat: return attend_all<float>(q, k, v, slots, lens, out, s);
    case at::kBFloat16: return attend_all<c10::BFloat16>(q, k, v, slots, lens, out, s);
    case at::kHalf: return attend_all<c10::Half>(q, k, v, slots, lens, out, s);
    default: TORCH_CHECK(false, "paged_decode: float32, bfloat16 or float16 only");
  }
}

}  // namespace

TORCH_LIBRARY(omni_cpu, m) {
  m.def("paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor slots, Tensor lens, "
        "float scale, int window, Tensor(a!) out) -> ()",
        &paged_decode);
}
