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
#include <cstdint>
#include <cstring>
#include <cmath>
#include <limits>
#include <vector>

namespace {

// 16 floats as one GCC vector: one AVX-512 register, two AVX2 or four SSE ones, so the
// same source is wide in every multi-versioned build below (the auto-vectorizer left the
// value loop scalar). Lanes are explicit, so sums keep their order without -ffast-math.
typedef float Vec __attribute__((vector_size(64)));
typedef uint16_t Half16 __attribute__((vector_size(32)));
typedef uint32_t Word16 __attribute__((vector_size(64)));
constexpr int64_t kLanes = 16;
constexpr int64_t kMaxDim = 512;  // head sizes beyond: the SDPA path (cpu_decode_kernel.py)

// inlined into each multi-versioned task below, so they are compiled for its target too
#define OMNI_INLINE __attribute__((always_inline)) inline

template <typename T>
OMNI_INLINE Vec load(const T* p) {  // float16: through float, one value at a time
  float values[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) values[j] = static_cast<float>(p[j]);
  Vec out;
  std::memcpy(&out, values, sizeof(out));
  return out;
}

template <>
OMNI_INLINE Vec load<float>(const float* p) {
  Vec out;
  std::memcpy(&out, p, sizeof(out));
  return out;
}

template <>
OMNI_INLINE Vec load<c10::BFloat16>(const c10::BFloat16* p) {  // bfloat16 = float's top half
  Half16 bits;
  std::memcpy(&bits, p, sizeof(bits));
  const Word16 wide = __builtin_convertvector(bits, Word16) << 16;
  Vec out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}

OMNI_INLINE float lane_sum(Vec v) {  // pairwise: a serial sum was the dot's longest chain
  float part[kLanes];
  std::memcpy(part, &v, sizeof(part));
  for (int64_t j = 0; j < 8; ++j) part[j] += part[j + 8];
  for (int64_t j = 0; j < 4; ++j) part[j] += part[j + 4];
  return (part[0] + part[2]) + (part[1] + part[3]);
}

// q . row over D (DIM when the head size is a compile-time constant, else dim)
template <typename T, int64_t DIM>
OMNI_INLINE float dot(const float* __restrict q, const T* __restrict row, int64_t dim) {
  const int64_t D = DIM ? DIM : dim;
  Vec acc = {};
  int64_t d = 0;
  for (; d + kLanes <= D; d += kLanes) acc += load(q + d) * load(row + d);
  float sum = lane_sum(acc);
  for (; d < D; ++d) sum += q[d] * static_cast<float>(row[d]);
  return sum;
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
  std::vector<float> query, scores;
};

// the first context position a query sees (sliding window or all)
OMNI_INLINE int64_t first_position(int64_t len, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, len - window) : 0;
}

// every length and every slot read in range, checked before the tasks start: an exception
// thrown inside a task would cross the parallel region and terminate the process
void check_contexts(const int64_t* slots, const int64_t* lens, int64_t batch,
                    int64_t slots_row, const Shapes& s) {
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = lens[b];
    TORCH_CHECK(len >= 1 && len <= s.width, "paged_decode: length ", len,
                " outside [1, ", s.width, "] for sequence ", b);
    for (int64_t p = first_position(len, s.window); p < len; ++p) {
      const int64_t slot = slots[b * slots_row + p];
      TORCH_CHECK(slot >= 0 && slot < s.num_slots, "paged_decode: slot ", slot,
                  " out of range for sequence ", b);
    }
  }
}

// scores[h * n + p] = scale * q_h . K[slots[p]], one pass over the K rows
template <typename T, int64_t DIM>
OMNI_INLINE void score(const Views<T>& t, const Shapes& s, const int64_t* slots, int64_t n,
                       int64_t g, Scratch& w) {
  const int64_t G = s.group, D = DIM ? DIM : s.dim;
  for (int64_t p = 0; p < n; ++p) {
    const T* key = t.k + slots[p] * t.k_slot + g * t.k_head;
    for (int64_t h = 0; h < G; ++h) {
      w.scores[h * n + p] = dot<T, DIM>(w.query.data() + h * D, key, D) * s.scale;
    }
  }
}

// scores -> unnormalised softmax weights in place; returns their sum
OMNI_INLINE float exponentiate(float* scores, int64_t n) {
  const float top = *std::max_element(scores, scores + n);
  float sum = 0.0f;
  for (int64_t p = 0; p < n; ++p) {
    scores[p] = std::exp(scores[p] - top);
    sum += scores[p];
  }
  return sum;
}

// out = sum_p weight[p] V[slots[p]] / total for one head; sum holds D rounded up to whole
// vectors (with a compile-time head size a local array the compiler keeps in registers)
template <typename T, int64_t DIM>
OMNI_INLINE void accumulate(const Views<T>& t, const int64_t* __restrict slots,
                            const float* __restrict weight, int64_t n, int64_t g,
                            float total, int64_t dim, Vec* __restrict sum,
                            T* __restrict dst) {
  const int64_t D = DIM ? DIM : dim, whole = D / kLanes;
  for (int64_t c = 0; c <= whole; ++c) sum[c] = Vec{};
  float* tail = reinterpret_cast<float*>(sum + whole);  // the last D % 16 values
  for (int64_t p = 0; p < n; ++p) {
    const T* __restrict row = t.v + slots[p] * t.v_slot + g * t.v_head;
    const float wp = weight[p];
    for (int64_t c = 0; c < whole; ++c) sum[c] += wp * load(row + c * kLanes);
    for (int64_t d = whole * kLanes; d < D; ++d) tail[d - whole * kLanes] += wp * static_cast<float>(row[d]);
  }
  const float inv = 1.0f / total;
  const float* values = reinterpret_cast<const float*>(sum);
  for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<T>(values[d] * inv);
}

// one head's output; the accumulator is a local array (with a compile-time head size
// the compiler keeps it in registers)
template <typename T, int64_t DIM>
OMNI_INLINE void weigh_values(const Views<T>& t, const int64_t* slots, const float* weight,
                              int64_t n, int64_t g, float total, int64_t dim, T* dst) {
  Vec local[(DIM ? DIM : kMaxDim) / kLanes + 1];
  accumulate<T, DIM>(t, slots, weight, n, g, total, dim, local, dst);
}

template <typename T, int64_t DIM>
OMNI_INLINE void attend_one(const Views<T>& t, const Shapes& s, int64_t b, int64_t g,
                            Scratch& w) {
  const int64_t len = t.lens[b];
  const int64_t start = first_position(len, s.window);
  const int64_t n = len - start, G = s.group, D = s.dim;
  w.query.resize(G * D);
  w.scores.resize(G * n);
  for (int64_t h = 0; h < G; ++h) {
    const T* src = t.q + (g * G + h) * t.q_head + b * t.q_batch;
    for (int64_t d = 0; d < D; ++d) w.query[h * D + d] = static_cast<float>(src[d]);
  }
  const int64_t* slots = t.slots + b * t.slots_row + start;
  score<T, DIM>(t, s, slots, n, g, w);
  for (int64_t h = 0; h < G; ++h) {
    float* weight = w.scores.data() + h * n;
    const float total = exponentiate(weight, n);
    weigh_values<T, DIM>(t, slots, weight, n, g, total, D,
                         t.out + (b * s.heads + g * G + h) * D);
  }
}

// The task's loops compiled for x86-64-v4 (AVX-512), v3 (AVX2) and the baseline, picked
// when the library loads (GCC function multi-versioning): a portable build that still uses
// the wide vectors of the CPU it runs on.
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
      switch (s.dim) { /* the common head sizes unrolled; any other one generic */       \
        case 64: return attend_one<T, 64>(t, s, b, g, w);                                 \
        case 128: return attend_one<T, 128>(t, s, b, g, w);                               \
        default: return attend_one<T, 0>(t, s, b, g, w);                                  \
      }                                                                                   \
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
  check_contexts(t.slots, t.lens, batch, t.slots_row, s);
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
  TORCH_CHECK(q.size(2) <= kMaxDim, "paged_decode: head_dim above ", kMaxDim);
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
