// A decode step's attention on the CPU, reading the paged KV cache in place.
//
// The portable path (paged_attention._sdpa_decode) copies every sequence's K and V rows
// out of the cache into a padded tensor and then lets SDPA read them again; this reads
// each cached row once, straight from its slot, and stops at each sequence's length.
// One task per (sequence, KV head): the query heads that share a KV head are scored
// against each block of K rows while it is in cache. Two passes: scores, then softmax
// weights times V rows, accumulated in float32 whatever the cache's dtype.
//
// Built by cpu_decode_kernel.py (g++ with torch's include paths, portable flags: no
// -march=native: the build is cached and may be reused on another CPU). Only light
// headers, so the first build takes seconds, not the half minute torch/extension.h takes.
// The loops are compiled twice on x86-64, for AVX2 (x86-64-v3, 8 lanes) and the baseline
// (SSE2, 4 lanes), and the widest the CPU runs is picked at each call (vector_isa;
// set_isa forces one, for tests).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_lanes.h"

namespace {

constexpr int64_t kMaxDim = 512;  // larger head sizes: the SDPA path (cpu_decode_kernel.py)
// Rows are fetched this many context positions before they are read. A sequence's slots
// jump at every block of 16, where the hardware prefetcher loses the stream. Fetching
// ahead took a batch-32 call at up to 330 positions, timed between steps, from 0.69 to
// 0.56 ms p25 (bench/probes/cpu_decode_sources.py, the shared 2-core VM; 8 and 32 ahead
// did no better than 16, and reading all KV heads of a slot per task no better than this).
constexpr int64_t kAhead = 16;

struct Shapes {
  int64_t heads, kv_heads, group, dim, width, num_slots;
  float scale;
  int64_t window;
};

// T: the queries' and outputs' type; C: the cache's (the same, or a narrower cache of a
// float32 model: option kv_cache_dtype, half the bytes each step reads)
template <typename T, typename C>
struct Views {
  const T* q;
  const C* k;
  const C* v;
  const int64_t* slots;
  const int64_t* lens;
  T* out;
  int64_t q_head, q_batch, k_slot, k_head, v_slot, v_head, slots_row;
};

// scratch of one worker, reused across its tasks
struct Scratch {
  std::vector<float> query, scores, totals;
};

// asks for one cached row (`bytes` from `row`) to be brought into cache, without waiting
OMNI_INLINE void prefetch_row(const void* row, int64_t bytes) {
  const char* at = static_cast<const char*>(row);
  for (int64_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(at + offset);
}

// the first context position a query sees (sliding window or all)
inline int64_t first_position(int64_t len, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, len - window) : 0;
}

// scores[h * stride + p] = scale * q_h . K[slots[p]], L K rows at a time (a short block
// repeats its last row; stride is n rounded up to L, so a block's store fits)
template <int L, typename T, typename C, int64_t DIM>
OMNI_INLINE void score(const Views<T, C>& t, const Shapes& s, const int64_t* slots, int64_t n,
                       int64_t stride, int64_t g, Scratch& w) {
  typedef typename Lanes<L>::Vec Vec;
  const int64_t G = s.group, D = DIM ? DIM : s.dim, whole = D / L * L;
  const int64_t row_bytes = D * static_cast<int64_t>(sizeof(C));
  for (int64_t p0 = 0; p0 < n; p0 += L) {
    for (int64_t p = p0 + kAhead; p < std::min<int64_t>(p0 + kAhead + L, n); ++p) {
      prefetch_row(t.k + slots[p] * t.k_slot + g * t.k_head, row_bytes);
    }
    const C* keys[L];
    for (int j = 0; j < L; ++j) {
      keys[j] = t.k + slots[std::min<int64_t>(p0 + j, n - 1)] * t.k_slot + g * t.k_head;
    }
    for (int64_t h = 0; h < G; ++h) {
      const float* q = w.query.data() + h * D;
      Vec part[L] = {};
      for (int64_t d = 0; d < whole; d += L) {
        const Vec qd = load<L>(q + d);
        for (int j = 0; j < L; ++j) part[j] += qd * load<L>(keys[j] + d);
      }
      Vec sums = fold<L>(part);
      for (int j = 0; whole < D && j < L; ++j) {  // the last D % L values of each row
        for (int64_t d = whole; d < D; ++d) sums[j] += q[d] * static_cast<float>(keys[j][d]);
      }
      sums *= s.scale;
      std::memcpy(w.scores.data() + h * stride + p0, &sums, sizeof(sums));
    }
  }
}

// Accumulators one pass over V keeps, in vectors: heads x (D / L + 1). With D 64 and 8
// lanes that is 14 query heads, with D 128 seven: every head of a group in one pass on the
// common layouts, so each V row is read once, not once per head (a group of 2 read V twice).
constexpr int64_t kAccVectors = 128;

// dst[h] = sum_p weight[h][p] V[slots[p]] / total[h] for `heads` query heads of one KV
// head (their weights `stride` apart, their outputs D apart); each V row is loaded into
// vectors once and added to every head's accumulator
template <int L, typename T, typename C, int64_t DIM>
OMNI_INLINE void weigh_values(const Views<T, C>& t, const int64_t* __restrict slots,
                              const float* __restrict weights, int64_t stride, int64_t n,
                              int64_t g, const float* totals, int64_t heads, int64_t dim,
                              T* __restrict dst) {
  typedef typename Lanes<L>::Vec Vec;
  const int64_t D = DIM ? DIM : dim, whole = D / L, per = whole + 1;
  Vec sum[kAccVectors];
  for (int64_t c = 0; c < heads * per; ++c) sum[c] = Vec{};
  Vec row_vectors[(DIM ? DIM : kMaxDim) / L];
  const int64_t row_bytes = D * static_cast<int64_t>(sizeof(C));
  for (int64_t p = 0; p < n; ++p) {
    if (p + kAhead < n) prefetch_row(t.v + slots[p + kAhead] * t.v_slot + g * t.v_head, row_bytes);
    const C* __restrict row = t.v + slots[p] * t.v_slot + g * t.v_head;
    for (int64_t c = 0; c < whole; ++c) row_vectors[c] = load<L>(row + c * L);
    for (int64_t h = 0; h < heads; ++h) {
      const float wp = weights[h * stride + p];
      Vec* acc = sum + h * per;
      for (int64_t c = 0; c < whole; ++c) acc[c] += wp * row_vectors[c];
      float* tail = reinterpret_cast<float*>(acc + whole);  // the last D % L values
      for (int64_t d = whole * L; d < D; ++d) tail[d - whole * L] += wp * static_cast<float>(row[d]);
    }
  }
  for (int64_t h = 0; h < heads; ++h) {
    const float inv = 1.0f / totals[h];
    const float* values = reinterpret_cast<const float*>(sum + h * per);
    for (int64_t d = 0; d < D; ++d) dst[h * D + d] = static_cast<T>(values[d] * inv);
  }
}

template <int L, typename T, typename C, int64_t DIM>
OMNI_INLINE void attend_one(const Views<T, C>& t, const Shapes& s, int64_t b, int64_t g,
                            Scratch& w) {
  const int64_t len = t.lens[b], start = first_position(len, s.window);
  const int64_t n = len - start, G = s.group, D = s.dim, stride = (n + L - 1) / L * L;
  w.query.resize(G * D);
  w.scores.resize(G * stride);
  w.totals.resize(G);
  for (int64_t h = 0; h < G; ++h) {
    const T* src = t.q + (g * G + h) * t.q_head + b * t.q_batch;
    for (int64_t d = 0; d < D; ++d) w.query[h * D + d] = static_cast<float>(src[d]);
  }
  const int64_t* slots = t.slots + b * t.slots_row + start;
  score<L, T, C, DIM>(t, s, slots, n, stride, g, w);
  for (int64_t h = 0; h < G; ++h) w.totals[h] = exponentiate<L>(w.scores.data() + h * stride, n);
  const int64_t chunk = std::max<int64_t>(1, kAccVectors / (D / L + 1));
  for (int64_t h0 = 0; h0 < G; h0 += chunk) {
    weigh_values<L, T, C, DIM>(t, slots, w.scores.data() + h0 * stride, stride, n, g,
                            w.totals.data() + h0, std::min(chunk, G - h0), D,
                            t.out + (b * s.heads + g * G + h0) * D);
  }
}

// the common head sizes unrolled; any other one generic
template <int L, typename T, typename C>
OMNI_INLINE void attend_tasks(const Views<T, C>& t, const Shapes& s, int64_t begin, int64_t end) {
  Scratch w;
  for (int64_t task = begin; task < end; ++task) {
    const int64_t b = task / s.kv_heads, g = task % s.kv_heads;
    switch (s.dim) {
      case 64: attend_one<L, T, C, 64>(t, s, b, g, w); break;
      case 128: attend_one<L, T, C, 128>(t, s, b, g, w); break;
      default: attend_one<L, T, C, 0>(t, s, b, g, w);
    }
  }
}

// one entry point per ISA, each inlining the whole task loop for its target and width
// (an AVX-512 version, 16 lanes, measured no faster than AVX2's 8: dropped)
enum Isa : int64_t { kAuto = 0, kBaseline = 1, kAvx2 = 2 };

template <typename T, typename C>
void tasks_baseline(const Views<T, C>& t, const Shapes& s, int64_t begin, int64_t end) {
  attend_tasks<4, T, C>(t, s, begin, end);  // SSE2 / NEON: 4 floats
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define OMNI_X86 1
template <typename T, typename C>
__attribute__((target("arch=x86-64-v3"))) void tasks_avx2(const Views<T, C>& t,
                                                          const Shapes& s, int64_t begin,
                                                          int64_t end) {
  attend_tasks<8, T, C>(t, s, begin, end);
}
#endif

int64_t widest_isa() {
#ifdef OMNI_X86
  if (__builtin_cpu_supports("x86-64-v3")) return kAvx2;
#endif
  return kBaseline;
}

std::atomic<int64_t> forced_isa{kAuto};

int64_t vector_isa() {
  const int64_t forced = forced_isa.load();
  return forced == kAuto ? widest_isa() : forced;
}

// tests: run one ISA's loops (0: the widest again); returns the one that will run
int64_t set_isa(int64_t isa) {
  TORCH_CHECK(isa >= kAuto && isa <= widest_isa(), "paged_decode: ISA ", isa,
              " is not one this CPU runs (widest: ", widest_isa(), ")");
  forced_isa.store(isa);
  return vector_isa();
}

template <typename T, typename C>
void run_tasks(const Views<T, C>& t, const Shapes& s, int64_t begin, int64_t end) {
#ifdef OMNI_X86
  switch (vector_isa()) {
    case kAvx2: return tasks_avx2<T, C>(t, s, begin, end);
    default: break;
  }
#endif
  tasks_baseline<T, C>(t, s, begin, end);
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

template <typename T, typename C>
void attend_all(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& slots, const at::Tensor& lens, at::Tensor& out,
                const Shapes& s) {
  const Views<T, C> t{q.data_ptr<T>(), k.data_ptr<C>(), v.data_ptr<C>(),
                   slots.data_ptr<int64_t>(), lens.data_ptr<int64_t>(), out.data_ptr<T>(),
                   q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
                   v.stride(1), slots.stride(0)};
  const int64_t batch = q.size(1);
  check_contexts(t.slots, t.lens, batch, t.slots_row, s);
  // a task is (sequence, KV head); split only where a task is worth a thread's wake-up
  const int64_t work = std::max<int64_t>(1, s.group * s.dim * s.width);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / work);
  at::parallel_for(0, batch * s.kv_heads, grain,
                   [&](int64_t begin, int64_t end) { run_tasks<T, C>(t, s, begin, end); });
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& slots, const at::Tensor& lens, const at::Tensor& out) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3,
              "paged_decode: q (H, B, D), caches (slots, KVH, D)");
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu(), "paged_decode: CPU tensors only");
  TORCH_CHECK(v.scalar_type() == k.scalar_type() && out.scalar_type() == q.scalar_type() &&
                  (k.scalar_type() == q.scalar_type() || q.scalar_type() == at::kFloat),
              "paged_decode: q and out share a dtype, the caches another; a cache unlike q "
              "only under float32 queries");
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
  const auto cache = k.scalar_type();
  switch (q.scalar_type()) {
    case at::kFloat:
      switch (cache) {
        case at::kFloat: return attend_all<float, float>(q, k, v, slots, lens, out, s);
        case at::kBFloat16:
          return attend_all<float, c10::BFloat16>(q, k, v, slots, lens, out, s);
        case at::kHalf: return attend_all<float, c10::Half>(q, k, v, slots, lens, out, s);
        default: break;
      }
      break;
    case at::kBFloat16:
      return attend_all<c10::BFloat16, c10::BFloat16>(q, k, v, slots, lens, out, s);
    case at::kHalf: return attend_all<c10::Half, c10::Half>(q, k, v, slots, lens, out, s);
    default: break;
  }
  TORCH_CHECK(false, "paged_decode: float32, bfloat16 or float16 only");
}

}  // namespace

TORCH_LIBRARY(omni_cpu, m) {
  m.def("paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor slots, Tensor lens, "
        "float scale, int window, Tensor(a!) out) -> ()",
        &paged_decode);
  m.def("set_isa(int isa) -> int", &set_isa);
}
