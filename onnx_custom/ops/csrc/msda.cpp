// multi_scale_deformable_attn (mmcv's MultiScaleDeformableAttnFunction semantics) for CPU.
//
// For every (batch b, query q, head h): output[b, q, h*D:(h+1)*D] = sum over levels l and points
// p of attention_weights[b, q, h, l, p] * bilinear(value level l of head h, at sampling location
// (x, y) = (loc_x * W_l - 0.5, loc_y * H_l - 0.5)), zero outside the level: exactly
// grid_sample(align_corners=False, padding_mode="zeros") on grid 2 * loc - 1. A sample at
// x < -1, x > W, y < -1, y > H or with a non-finite coordinate contributes 0 and gets zero
// gradients (every corner of it lies outside; the check also keeps floor() of huge values or NaN
// from overflowing int64). On the lines x = -1 / x = W the value is 0 but the derivative, as
// grid_sample's, is that of the inside corners.
//
// Validation (shapes, dtypes, the spatial_shapes / level_start_index / num_keys contract) lives in
// Python (onnx_custom/ops/msda.py); this file trusts its inputs. Any strides are accepted: the
// float tensors are converted to dense copies in the compute dtype (float32 for float16 and
// bfloat16, else their own) and results are rounded once at the end.
//
// value (bs, K, M, D) stores each (key, head) as D contiguous numbers, so every bilinear corner is
// one contiguous D-vector: the inner loops are plain axpy / dot over D, which the compiler
// vectorizes. The forward is parallel over (b, q); the backward over (batch, block of heads)
// items, query by query within an item, whose value gradients never overlap (split further by
// queries with private buffers, summed in a fixed order, when there are fewer (b, h) pairs than
// threads), so results never depend on thread timing. No output is zero-filled up front: the
// forward writes each output row once, the backward writes every location / weight gradient and
// each item zeroes its own value-gradient rows.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <type_traits>
#include <cmath>
#include <vector>

#include "onnx_custom/kernels/msda.h"  // onnx_custom/runtime/include: shared with the native kernel

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace {

using onnx_custom_msda_math::Cell;
using onnx_custom_msda_math::corner_row;
using onnx_custom_msda_math::corner_weights;
using onnx_custom_msda_math::sample_cell;

inline at::ScalarType compute_type(at::ScalarType t) {
  return (t == at::kHalf || t == at::kBFloat16) ? at::kFloat : t;
}

struct Geometry {
  int64_t bs, K, M, D, Q, L, P;
  std::vector<int64_t> H, W, start;
};

Geometry make_geometry(const at::Tensor& value, const at::Tensor& shapes, const at::Tensor& starts,
                       const at::Tensor& loc) {
  Geometry g;
  g.bs = value.size(0); g.K = value.size(1); g.M = value.size(2); g.D = value.size(3);
  g.Q = loc.size(1); g.L = loc.size(3); g.P = loc.size(4);
  const at::Tensor s = shapes.to(at::kLong).contiguous(), st = starts.to(at::kLong).contiguous();
  const int64_t* sp = s.data_ptr<int64_t>();
  const int64_t* stp = st.data_ptr<int64_t>();
  for (int64_t l = 0; l < g.L; ++l) {
    g.H.push_back(sp[2 * l]);
    g.W.push_back(sp[2 * l + 1]);
    g.start.push_back(stp[l]);
  }
  return g;
}

// Head dims are processed in chunks of kChunk numbers with a compile-time width, so the
// accumulator (forward) and the output gradient (backward) of a chunk stay in registers across
// all the samples of a (query, head); the remainder (D % kChunk) takes a runtime-width pass.
constexpr int64_t kChunk = 32;

// One bilinear corner with a non-zero contribution: its value row and its weight.
template <typename T>
struct Tap {
  const T* v;
  T w;
};

template <typename T, int64_t N>
inline void gather_chunk(const Tap<T>* taps, int64_t n, int64_t d0, T* __restrict out) {
  T acc[N] = {};
  for (int64_t t = 0; t < n; ++t) {
    const T* __restrict v = taps[t].v + d0;
    const T w = taps[t].w;
    for (int64_t d = 0; d < N; ++d) acc[d] += w * v[d];
  }
  for (int64_t d = 0; d < N; ++d) out[d0 + d] = acc[d];
}

template <typename T>
inline void gather_rest(const Tap<T>* taps, int64_t n, int64_t d0, int64_t d1, T* __restrict out) {
  for (int64_t d = d0; d < d1; ++d) out[d] = T(0);
  for (int64_t t = 0; t < n; ++t) {
    const T* __restrict v = taps[t].v;
    const T w = taps[t].w;
    for (int64_t d = d0; d < d1; ++d) out[d] += w * v[d];
  }
}

// Output rows [begin, end) of (b * Q + q): each (query, head) first lists its taps (every in-range
// corner of every sample with its attention x bilinear weight), then sums them chunk by chunk and
// writes the result once (the output needs no zero-fill).
template <typename T>
void forward_rows(const Geometry& g, const T* value, const T* loc, const T* attn, T* out,
                  int64_t begin, int64_t end) {
  const int64_t key_stride = g.M * g.D;  // between consecutive keys of one head
  std::vector<Tap<T>> taps(4 * g.L * g.P);
  for (int64_t bq = begin; bq < end; ++bq) {
    const int64_t b = bq / g.Q;
    const T* vb = value + b * g.K * key_stride;
    for (int64_t h = 0; h < g.M; ++h) {
      T* row_out = out + bq * key_stride + h * g.D;
      const T* vh = vb + h * g.D;
      const int64_t sample0 = (bq * g.M + h) * g.L * g.P;
      int64_t n = 0;
      for (int64_t l = 0; l < g.L; ++l) {
        for (int64_t p = 0; p < g.P; ++p) {
          const int64_t s = sample0 + l * g.P + p;
          Cell<T> c;
          if (!sample_cell(loc[2 * s], loc[2 * s + 1], g.H[l], g.W[l], g.start[l], &c)) continue;
          T w[4];
          corner_weights(c, w);
          const T a = attn[s];
          for (int corner = 0; corner < 4; ++corner) {
            if (c.in[corner]) taps[n++] = {vh + corner_row(c, corner, g.W[l]) * key_stride, a * w[corner]};
          }
        }
      }
      int64_t d0 = 0;
      for (; d0 + kChunk <= g.D; d0 += kChunk) gather_chunk<T, kChunk>(taps.data(), n, d0, row_out);
      if (d0 < g.D) gather_rest(taps.data(), n, d0, g.D, row_out);
    }
  }
}

// ----------------------------------------------------------------------------------- backward
// The backward of one (query, head) "unit": for every in-range bilinear corner ("tap") of its
// samples, dot = grad_output . value row (for the location / weight gradients) and
// value_grad row += attention x bilinear weight x grad_output, both in ONE pass over the head dim
// with the output-gradient chunk held in registers. Units run in a pipeline: the next unit's taps
// are worked out (and their value and value-gradient rows prefetched) before the current unit's
// taps are processed, so the rows arrive from L2/L3 while the current unit computes: on the
// Deformable-DETR encoder size the corner rows miss L1 most of the time, which cost the previous
// kernel ~40% of its time.

// One contributing sample of a unit: what its location / weight gradients need.
template <typename T>
struct UnitSample {
  int64_t s;     // index into attention_weights (sampling_locations: 2 * s)
  T lx, ly;      // position inside the bilinear cell
  T a, sx, sy;   // attention weight, level width and height (d pixel / d location)
  int32_t tap[4];  // the corner's tap index, -1: the corner lies outside the level
};

// A unit's taps as columns (both setups, scalar and AVX2, produce this one layout, so one tap pass
// serves them): tap t reads value row v[t], adds into value-gradient row gv[t] with weight aw[t]
// (attention x bilinear weight).
template <typename T>
struct TapList {
  std::vector<const T*> v;
  std::vector<T*> gv;
  std::vector<T> aw;
  void resize(int64_t n) {
    v.resize(n);
    gv.resize(n);
    aw.resize(n);
  }
};

// A unit's samples and taps; two of them make the pipeline.
template <typename T>
struct Unit {
  int64_t bq = 0, h = 0, count = 0, taps = 0;
  std::vector<UnitSample<T>> samples;
  TapList<T> tap;
};

template <typename T>
inline void prefetch_row(const T* p, int64_t D, int write) {
#if defined(__GNUC__) || defined(__clang__)
  const char* c = reinterpret_cast<const char*>(p);
  const int64_t bytes = D * static_cast<int64_t>(sizeof(T));
  // First and last byte: a line-aligned row of up to 128 bytes (D = 32 floats, value's usual
  // layout); longer rows get the lines in between too. (Only a hint: a missed line costs time.)
  if (write) {
    __builtin_prefetch(c, 1, 3);
    for (int64_t o = 64; o < bytes - 64; o += 64) __builtin_prefetch(c + o, 1, 3);
    __builtin_prefetch(c + bytes - 1, 1, 3);
  } else {
    __builtin_prefetch(c, 0, 3);
    for (int64_t o = 64; o < bytes - 64; o += 64) __builtin_prefetch(c + o, 0, 3);
    __builtin_prefetch(c + bytes - 1, 0, 3);
  }
#else
  (void)p; (void)D; (void)write;
#endif
}

// Work out unit (b, q, h): samples, taps, prefetches. Samples that contribute nothing get their
// (zero) location / weight gradients written here.
template <typename T>
void prepare_unit(const Geometry& g, int64_t b, int64_t q, int64_t h, const T* value, const T* loc,
                  const T* attn, T* gv, int64_t gv_stride, T* gloc, T* gattn, Unit<T>& u) {
  const int64_t key_stride = g.M * g.D;
  const T* vh = value + b * g.K * key_stride + h * g.D;
  u.bq = b * g.Q + q;
  u.h = h;
  u.count = u.taps = 0;
  // (column pointers in locals: through the vectors they would be reloaded after every store)
  const T** tv = u.tap.v.data();
  T** tgv = u.tap.gv.data();
  T* taw = u.tap.aw.data();
  const int64_t sample0 = (u.bq * g.M + h) * g.L * g.P;
  for (int64_t l = 0; l < g.L; ++l) {
    const int64_t W = g.W[l];
    for (int64_t p = 0; p < g.P; ++p) {
      const int64_t s = sample0 + l * g.P + p;
      Cell<T> c;
      if (!sample_cell(loc[2 * s], loc[2 * s + 1], g.H[l], W, g.start[l], &c)) {
        gattn[s] = T(0);
        gloc[2 * s] = gloc[2 * s + 1] = T(0);
        continue;
      }
      UnitSample<T>& sm = u.samples[u.count++];
      sm.s = s;
      sm.lx = c.lx;
      sm.ly = c.ly;
      sm.a = attn[s];
      sm.sx = static_cast<T>(W);
      sm.sy = static_cast<T>(g.H[l]);
      T w[4];
      corner_weights(c, w);
      for (int corner = 0; corner < 4; ++corner) {
        if (!c.in[corner]) {
          sm.tap[corner] = -1;
          continue;
        }
        const int64_t row = corner_row(c, corner, W), t = u.taps++;
        tv[t] = vh + row * key_stride;
        tgv[t] = gv + row * gv_stride;
        taw[t] = sm.a * w[corner];
        prefetch_row(tv[t], g.D, 0);
        prefetch_row(tgv[t], g.D, 1);
        sm.tap[corner] = static_cast<int32_t>(t);
      }
    }
  }
}

// The tap pass runs once per (query, head) unit (~60 taps on the Deformable-DETR size): forced
// inline into both setups' loops (as when each had its own copy): out of line, the shared pass
// measured 1.007-1.012x the two copies' backward kernel, inline 0.98-1.00x (paired, CPU time,
// 1 thread).
#if defined(__GNUC__) || defined(__clang__)
#define MSDA_INLINE inline __attribute__((always_inline))
#else
#define MSDA_INLINE inline
#endif

// Portable tap pass: any dtype, any D. dots[t] = go . v_t; gv_t += aw_t * go.
template <typename T>
MSDA_INLINE void taps_generic(const TapList<T>& taps, int64_t n, const T* __restrict go, int64_t D, T* dots) {
  const T* const* tv = taps.v.data();
  T* const* tgv = taps.gv.data();
  const T* taw = taps.aw.data();
  for (int64_t t = 0; t < n; ++t) {
    const T* __restrict v = tv[t];
    T* __restrict gvr = tgv[t];
    const T aw = taw[t];
    T sum = T(0);
    // A reduction: without the pragma the compiler keeps it scalar (it may not reorder float
    // additions on its own). The order depends on D only: results are reproducible.
#pragma omp simd reduction(+ : sum)
    for (int64_t d = 0; d < D; ++d) {
      sum += go[d] * v[d];
      gvr[d] += aw * go[d];
    }
    dots[t] = sum;
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// float32 with D % 8 == 0: the output-gradient chunk (NV vectors of 8) stays in registers; each
// tap's dot is left as 8 partial sums and reduced 8 taps at a time (one transposing hadd tree
// instead of one horizontal sum per tap).
// (The columns' base pointers are hoisted into locals: through the TapList the compiler would
// reload them after every store into a value-gradient row.)
template <int NV>
inline void taps_avx_chunk(const TapList<float>& taps, int64_t n, const float* go, int64_t d0, __m256* parts,
                           bool first) {
  __m256 gr[NV];
  for (int k = 0; k < NV; ++k) gr[k] = _mm256_loadu_ps(go + d0 + 8 * k);
  const float* const* tv = taps.v.data();
  float* const* tgv = taps.gv.data();
  const float* taw = taps.aw.data();
  for (int64_t t = 0; t < n; ++t) {
    const float* v = tv[t] + d0;
    float* gvr = tgv[t] + d0;
    const __m256 aw = _mm256_set1_ps(taw[t]);
    __m256 acc0 = _mm256_mul_ps(gr[0], _mm256_loadu_ps(v));
    __m256 acc1 = NV > 1 ? _mm256_mul_ps(gr[NV > 1 ? 1 : 0], _mm256_loadu_ps(v + 8)) : _mm256_setzero_ps();
    for (int k = 2; k < NV; ++k) {
      const __m256 vk = _mm256_loadu_ps(v + 8 * k);
      if (k % 2 == 0) acc0 = _mm256_fmadd_ps(gr[k], vk, acc0); else acc1 = _mm256_fmadd_ps(gr[k], vk, acc1);
    }
    for (int k = 0; k < NV; ++k) {
      _mm256_storeu_ps(gvr + 8 * k, _mm256_fmadd_ps(aw, gr[k], _mm256_loadu_ps(gvr + 8 * k)));
    }
    const __m256 p = _mm256_add_ps(acc0, acc1);
    parts[t] = first ? p : _mm256_add_ps(parts[t], p);
  }
}

// The 8 horizontal sums of p[0..7], in lanes 0..7.
inline __m256 hsum8(const __m256* p) {
  const __m256 a = _mm256_hadd_ps(p[0], p[1]), b = _mm256_hadd_ps(p[2], p[3]);
  const __m256 c = _mm256_hadd_ps(p[4], p[5]), d = _mm256_hadd_ps(p[6], p[7]);
  const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
  return _mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20), _mm256_permute2f128_ps(ab, cd, 0x31));
}

MSDA_INLINE void taps_avx(const TapList<float>& taps, int64_t n, const float* go, int64_t D, float* dots,
              std::vector<__m256>& parts) {
  const int64_t padded = (n + 7) / 8 * 8;
  if (static_cast<int64_t>(parts.size()) < padded) parts.resize(padded);
  int64_t d0 = 0;
  for (; d0 + 32 <= D; d0 += 32) taps_avx_chunk<4>(taps, n, go, d0, parts.data(), d0 == 0);
  switch ((D - d0) / 8) {
    case 1: taps_avx_chunk<1>(taps, n, go, d0, parts.data(), d0 == 0); break;
    case 2: taps_avx_chunk<2>(taps, n, go, d0, parts.data(), d0 == 0); break;
    case 3: taps_avx_chunk<3>(taps, n, go, d0, parts.data(), d0 == 0); break;
    default: break;
  }
  for (int64_t t = n; t < padded; ++t) parts[t] = _mm256_setzero_ps();
  for (int64_t t = 0; t < padded; t += 8) _mm256_storeu_ps(dots + t, hsum8(parts.data() + t));
}
#endif

template <typename T>
struct TapScratch {
  std::vector<T> dots;
#if defined(__AVX2__) && defined(__FMA__)
  std::vector<__m256> parts;
#endif
};

// The tap pass of a unit, whichever setup listed its taps: dots[t] = go . v_t and gv_t += aw_t * go
// for t < n (dots holds at least n rounded up to 8).
template <typename T>
MSDA_INLINE void tap_pass(const TapList<T>& taps, int64_t n, const T* go, int64_t D, T* dots, TapScratch<T>& ts) {
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_same_v<T, float>) {
    if (D % 8 == 0) {
      taps_avx(taps, n, go, D, dots, ts.parts);
      return;
    }
  }
#endif
  (void)ts;
  taps_generic(taps, n, go, D, dots);
}

// Process a prepared unit: the tap pass, then each contributing sample's location and weight
// gradients from its corners' dots.
template <typename T>
void process_unit(const Geometry& g, const T* grad, T* gloc, T* gattn, const Unit<T>& u, TapScratch<T>& ts) {
  const T* go = grad + u.bq * g.M * g.D + u.h * g.D;
  const int64_t n = u.taps;
  if (static_cast<int64_t>(ts.dots.size()) < (n + 7) / 8 * 8) ts.dots.resize((n + 7) / 8 * 8);
  T* dots = ts.dots.data();
  tap_pass(u.tap, n, go, g.D, dots, ts);
  for (int64_t i = 0; i < u.count; ++i) {
    const UnitSample<T>& sm = u.samples[i];
    T dot[4];
    for (int corner = 0; corner < 4; ++corner) dot[corner] = sm.tap[corner] >= 0 ? dots[sm.tap[corner]] : T(0);
    const T hx = T(1) - sm.lx, hy = T(1) - sm.ly;
    gattn[sm.s] = hy * hx * dot[0] + hy * sm.lx * dot[1] + sm.ly * hx * dot[2] + sm.ly * sm.lx * dot[3];
    const T dx = hy * (dot[1] - dot[0]) + sm.ly * (dot[3] - dot[2]);
    const T dy = hx * (dot[2] - dot[0]) + sm.lx * (dot[3] - dot[1]);
    gloc[2 * sm.s] = sm.a * sm.sx * dx;
    gloc[2 * sm.s + 1] = sm.a * sm.sy * dy;
  }
}

// Gradients of the queries [q0, q1) of heads [h0, h1) in batch b, query by query (all of a
// query's heads together: the rows they touch are neighbours in value's (key, head, dim) layout).
// The value gradient of key k, head h goes to gv[k * gv_stride + (h - h0) * gv_head : + D]; every
// sampling-location and attention-weight gradient of these queries is written (zeros for samples
// that contribute nothing), so neither needs a zero-fill.
template <typename T>
void backward_block(const Geometry& g, int64_t b, int64_t h0, int64_t h1, int64_t q0, int64_t q1,
                    const T* value, const T* loc, const T* attn, const T* grad, T* gv,
                    int64_t gv_stride, int64_t gv_head, T* gloc, T* gattn) {
  Unit<T> units[2];
  for (Unit<T>& u : units) {
    u.samples.resize(g.L * g.P);
    u.tap.resize(4 * g.L * g.P);
  }
  TapScratch<T> ts;
  const int64_t heads = h1 - h0, total = (q1 - q0) * heads;
  if (total == 0) return;
  const auto prepare = [&](int64_t i, Unit<T>& u) {
    const int64_t q = q0 + i / heads, h = h0 + i % heads;
    prepare_unit(g, b, q, h, value, loc, attn, gv + (h - h0) * gv_head, gv_stride, gloc, gattn, u);
  };
  prepare(0, units[0]);
  for (int64_t i = 0; i < total; ++i) {
    if (i + 1 < total) prepare(i + 1, units[(i + 1) & 1]);
    process_unit(g, grad, gloc, gattn, units[i & 1], ts);
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// ------------------------------------------------------------- float32 AVX2 per-sample setup
// The per-sample work of a (query, head) (its cell, bilinear weights, which corners lie inside,
// the location / weight gradients) done 8 samples at a time instead of one by one: the L*P
// samples of a unit are contiguous in sampling_locations, attention_weights and their gradients,
// and each lane's level is fixed (sample i is level i / P), so the level sizes are per-lane
// constants. Same arithmetic as sample_cell / process_unit per sample, without the branches; the
// inside corners become taps through a lane-compress table (taps ordered corner by corner within
// each 8 samples: a fixed order, so results stay reproducible). Paired CPU time, 1 thread, on the
// benchmark's encoder size: backward kernel 0.79-0.81x the scalar setup's.

// Per-lane level geometry of a unit's samples, padded to whole vectors of 8. Padding lanes get
// W = H = -2, which no location satisfies (-1 <= x <= W): they are never valid.
struct LaneGeometry {
  int64_t n = 0, padded = 0, zero_slot = 0;
  std::vector<float> Wf, Hf;
  std::vector<int32_t> Wi, start;
};

LaneGeometry make_lanes(const Geometry& g) {
  LaneGeometry lg;
  lg.n = g.L * g.P;
  lg.padded = (lg.n + 7) / 8 * 8;
  lg.zero_slot = (4 * lg.n + 7) / 8 * 8;  // beyond every tap's dot: stays 0
  lg.Wf.assign(lg.padded, -2.f);
  lg.Hf.assign(lg.padded, -2.f);
  lg.Wi.assign(lg.padded, 0);
  lg.start.assign(lg.padded, 0);
  for (int64_t i = 0; i < lg.n; ++i) {
    const int64_t l = i / g.P;
    lg.Wf[i] = static_cast<float>(g.W[l]);
    lg.Hf[i] = static_cast<float>(g.H[l]);
    lg.Wi[i] = static_cast<int32_t>(g.W[l]);
    lg.start[i] = static_cast<int32_t>(g.start[l]);
  }
  return lg;
}

struct FastUnit {
  int64_t bq = 0, h = 0, taps = 0, s0 = 0;
  const float* vh = nullptr;     // value of (b, head h); row r at vh + r * M * D
  float* gvh = nullptr;          // its value gradient; row r at gvh + r * gv_stride
  TapList<float> tap;            // the taps: inside corners, corner by corner
  std::vector<int32_t> idx;      // corner c of sample i: its tap's dot at dots[idx[c * padded + i]]
  std::vector<float> lx, ly, a, any;  // any: all-ones bits when some corner of the sample is inside
};

// For an 8-bit lane mask m: compress[m] lists the set lanes first (a permutevar8x32 index),
// expand[m][i] is lane i's position among the set lanes.
struct LaneTables {
  alignas(32) int32_t compress[256][8];
  alignas(32) int32_t expand[256][8];
  LaneTables() {
    for (int m = 0; m < 256; ++m) {
      int k = 0;
      for (int i = 0; i < 8; ++i) {
        expand[m][i] = k;
        if ((m >> i) & 1) compress[m][k++] = i;
      }
      for (int j = k; j < 8; ++j) compress[m][j] = 0;
    }
  }
};

inline const LaneTables& lane_tables() {
  static const LaneTables tables;
  return tables;
}

// Lanes [0, count) of an 8-lane mask.
inline __m256i lane_mask(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

void prepare_fast(const Geometry& g, const LaneGeometry& lg, int64_t b, int64_t q, int64_t h,
                  const float* value, const float* loc, const float* attn, float* gv, int64_t gv_stride,
                  FastUnit& u) {
  const int64_t key_stride = g.M * g.D;
  u.vh = value + b * g.K * key_stride + h * g.D;
  u.gvh = gv;
  u.bq = b * g.Q + q;
  u.h = h;
  u.taps = 0;
  u.s0 = (u.bq * g.M + h) * lg.n;
  const LaneTables& tables = lane_tables();
  // (strides in bytes fit 32 bits: checked by the caller)
  const __m256i vbase = _mm256_set1_epi64x(static_cast<long long>(reinterpret_cast<intptr_t>(u.vh)));
  const __m256i gbase = _mm256_set1_epi64x(static_cast<long long>(reinterpret_cast<intptr_t>(u.gvh)));
  const __m256i vstride = _mm256_set1_epi64x(key_stride * static_cast<int64_t>(sizeof(float)));
  const __m256i gstride = _mm256_set1_epi64x(gv_stride * static_cast<int64_t>(sizeof(float)));
  const float* lp = loc + 2 * u.s0;
  const float* ap = attn + u.s0;
  const __m256 one = _mm256_set1_ps(1.f), minus1 = _mm256_set1_ps(-1.f), half = _mm256_set1_ps(0.5f),
               zero = _mm256_setzero_ps();
  for (int64_t i0 = 0; i0 < lg.n; i0 += 8) {
    const int64_t count = std::min<int64_t>(8, lg.n - i0);
    __m256 xy0, xy1, a;
    if (count == 8) {
      xy0 = _mm256_loadu_ps(lp + 2 * i0);
      xy1 = _mm256_loadu_ps(lp + 2 * i0 + 8);
      a = _mm256_loadu_ps(ap + i0);
    } else {  // never read past the unit's samples
      xy0 = _mm256_maskload_ps(lp + 2 * i0, lane_mask(2 * count));
      xy1 = _mm256_maskload_ps(lp + 2 * i0 + 8, lane_mask(2 * count - 8));
      a = _mm256_maskload_ps(ap + i0, lane_mask(count));
    }
    // (x0 y0 x1 y1 | x2 y2 x3 y3), (x4 ...): shuffles give x0 x1 x4 x5 | x2 x3 x6 x7, then reorder.
    const __m256 xs = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(xy0, xy1, 0x88)), 0xD8));
    const __m256 ys = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(xy0, xy1, 0xDD)), 0xD8));
    const __m256 W = _mm256_loadu_ps(lg.Wf.data() + i0), H = _mm256_loadu_ps(lg.Hf.data() + i0);
    __m256 x = _mm256_fmsub_ps(xs, W, half), y = _mm256_fmsub_ps(ys, H, half);
    // Ordered compares: false for NaN.
    const __m256 valid = _mm256_and_ps(
        _mm256_and_ps(_mm256_cmp_ps(x, minus1, _CMP_GE_OQ), _mm256_cmp_ps(x, W, _CMP_LE_OQ)),
        _mm256_and_ps(_mm256_cmp_ps(y, minus1, _CMP_GE_OQ), _mm256_cmp_ps(y, H, _CMP_LE_OQ)));
    x = _mm256_and_ps(x, valid);  // invalid lanes -> 0: floor and the int conversion stay in range
    y = _mm256_and_ps(y, valid);
    const __m256 fx = _mm256_floor_ps(x), fy = _mm256_floor_ps(y);
    const __m256 lx = _mm256_sub_ps(x, fx), ly = _mm256_sub_ps(y, fy);
    const __m256 x0in = _mm256_and_ps(_mm256_cmp_ps(fx, zero, _CMP_GE_OQ), _mm256_cmp_ps(fx, W, _CMP_LT_OQ));
    const __m256 x1in = _mm256_cmp_ps(_mm256_add_ps(fx, one), W, _CMP_LT_OQ);  // fx >= -1 when valid
    const __m256 y0in = _mm256_and_ps(_mm256_cmp_ps(fy, zero, _CMP_GE_OQ), _mm256_cmp_ps(fy, H, _CMP_LT_OQ));
    const __m256 y1in = _mm256_cmp_ps(_mm256_add_ps(fy, one), H, _CMP_LT_OQ);
    const __m256 yv0 = _mm256_and_ps(valid, y0in), yv1 = _mm256_and_ps(valid, y1in);
    const __m256 in0 = _mm256_and_ps(yv0, x0in), in1 = _mm256_and_ps(yv0, x1in);
    const __m256 in2 = _mm256_and_ps(yv1, x0in), in3 = _mm256_and_ps(yv1, x1in);
    const int m[4] = {_mm256_movemask_ps(in0), _mm256_movemask_ps(in1), _mm256_movemask_ps(in2),
                      _mm256_movemask_ps(in3)};
    const __m256i Wi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lg.Wi.data() + i0));
    const __m256i row = _mm256_add_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lg.start.data() + i0)),
        _mm256_add_epi32(_mm256_mullo_epi32(_mm256_cvtps_epi32(fy), Wi), _mm256_cvtps_epi32(fx)));
    const __m256i one_i = _mm256_set1_epi32(1);
    const __m256i rows[4] = {row, _mm256_add_epi32(row, one_i), _mm256_add_epi32(row, Wi),
                             _mm256_add_epi32(_mm256_add_epi32(row, Wi), one_i)};
    const __m256 hx = _mm256_sub_ps(one, lx), hy = _mm256_sub_ps(one, ly);
    const __m256 aw[4] = {_mm256_mul_ps(a, _mm256_mul_ps(hy, hx)), _mm256_mul_ps(a, _mm256_mul_ps(hy, lx)),
                          _mm256_mul_ps(a, _mm256_mul_ps(ly, hx)), _mm256_mul_ps(a, _mm256_mul_ps(ly, lx))};
    const __m256 ins[4] = {in0, in1, in2, in3};
    _mm256_storeu_ps(u.lx.data() + i0, lx);
    _mm256_storeu_ps(u.ly.data() + i0, ly);
    _mm256_storeu_ps(u.a.data() + i0, a);
    _mm256_storeu_ps(u.any.data() + i0, _mm256_or_ps(_mm256_or_ps(in0, in1), _mm256_or_ps(in2, in3)));
    // Append the inside corners' rows and weights as taps, 8 lanes at a time (compressed through
    // a lane table, no per-corner branch); idx: where each corner's dot will be (zero_slot: 0).
    const __m256i zero_slot = _mm256_set1_epi32(static_cast<int32_t>(lg.zero_slot));
    for (int corner = 0; corner < 4; ++corner) {
      const int mk = m[corner];
      const __m256i perm = _mm256_load_si256(reinterpret_cast<const __m256i*>(tables.compress[mk]));
      // Row pointers, 64-bit: base + row * stride (bytes), 4 lanes at a time.
      const __m256i packed = _mm256_permutevar8x32_epi32(rows[corner], perm);
      const __m256i lo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(packed));
      const __m256i hi = _mm256_cvtepi32_epi64(_mm256_extracti128_si256(packed, 1));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(u.tap.v.data() + u.taps), _mm256_add_epi64(vbase, _mm256_mul_epi32(lo, vstride)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(u.tap.v.data() + u.taps + 4), _mm256_add_epi64(vbase, _mm256_mul_epi32(hi, vstride)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(u.tap.gv.data() + u.taps), _mm256_add_epi64(gbase, _mm256_mul_epi32(lo, gstride)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(u.tap.gv.data() + u.taps + 4), _mm256_add_epi64(gbase, _mm256_mul_epi32(hi, gstride)));
      _mm256_storeu_ps(u.tap.aw.data() + u.taps, _mm256_permutevar8x32_ps(aw[corner], perm));
      const __m256i pos = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(u.taps)),
                                           _mm256_load_si256(reinterpret_cast<const __m256i*>(tables.expand[mk])));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(u.idx.data() + corner * lg.padded + i0),
                          _mm256_blendv_epi8(zero_slot, pos, _mm256_castps_si256(ins[corner])));
      u.taps += __builtin_popcount(static_cast<unsigned>(mk));
    }
  }
  // Ask for the taps' rows now: they arrive while the previous unit computes.
  for (int64_t t = 0; t < u.taps; ++t) {
    prefetch_row(u.tap.v[t], g.D, 0);
    prefetch_row(u.tap.gv[t], g.D, 1);
  }
}

void process_fast(const Geometry& g, const LaneGeometry& lg, const float* grad, float* gloc, float* gattn,
                  const FastUnit& u, TapScratch<float>& ts) {
  const float* go = grad + u.bq * g.M * g.D + u.h * g.D;
  const int64_t n = u.taps;
  float* dots = ts.dots.data();
  tap_pass(u.tap, n, go, g.D, dots, ts);
  float* ga = gattn + u.s0;
  float* gl = gloc + 2 * u.s0;
  const __m256 one = _mm256_set1_ps(1.f);
  for (int64_t i0 = 0; i0 < lg.n; i0 += 8) {
    const int32_t* idx = u.idx.data() + i0;
    const auto dot = [&](int corner) {
      return _mm256_i32gather_ps(dots, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx + corner * lg.padded)), 4);
    };
    const __m256 d0 = dot(0), d1 = dot(1), d2 = dot(2), d3 = dot(3);
    const __m256 lx = _mm256_loadu_ps(u.lx.data() + i0), ly = _mm256_loadu_ps(u.ly.data() + i0);
    const __m256 a = _mm256_loadu_ps(u.a.data() + i0), any = _mm256_loadu_ps(u.any.data() + i0);
    const __m256 hx = _mm256_sub_ps(one, lx), hy = _mm256_sub_ps(one, ly);
    __m256 gw = _mm256_mul_ps(_mm256_mul_ps(hy, hx), d0);
    gw = _mm256_fmadd_ps(_mm256_mul_ps(hy, lx), d1, gw);
    gw = _mm256_fmadd_ps(_mm256_mul_ps(ly, hx), d2, gw);
    gw = _mm256_fmadd_ps(_mm256_mul_ps(ly, lx), d3, gw);
    const __m256 dx = _mm256_fmadd_ps(hy, _mm256_sub_ps(d1, d0), _mm256_mul_ps(ly, _mm256_sub_ps(d3, d2)));
    const __m256 dy = _mm256_fmadd_ps(hx, _mm256_sub_ps(d2, d0), _mm256_mul_ps(lx, _mm256_sub_ps(d3, d1)));
    // Samples with no corner inside get exact zeros (whatever their attention weight).
    gw = _mm256_and_ps(gw, any);
    const __m256 gx = _mm256_and_ps(_mm256_mul_ps(_mm256_mul_ps(a, _mm256_loadu_ps(lg.Wf.data() + i0)), dx), any);
    const __m256 gy = _mm256_and_ps(_mm256_mul_ps(_mm256_mul_ps(a, _mm256_loadu_ps(lg.Hf.data() + i0)), dy), any);
    const __m256 lo = _mm256_unpacklo_ps(gx, gy), hi = _mm256_unpackhi_ps(gx, gy);
    const __m256 xy0 = _mm256_permute2f128_ps(lo, hi, 0x20), xy1 = _mm256_permute2f128_ps(lo, hi, 0x31);
    const int64_t count = std::min<int64_t>(8, lg.n - i0);
    if (count == 8) {
      _mm256_storeu_ps(ga + i0, gw);
      _mm256_storeu_ps(gl + 2 * i0, xy0);
      _mm256_storeu_ps(gl + 2 * i0 + 8, xy1);
    } else {
      _mm256_maskstore_ps(ga + i0, lane_mask(count), gw);
      _mm256_maskstore_ps(gl + 2 * i0, lane_mask(2 * count), xy0);
      _mm256_maskstore_ps(gl + 2 * i0 + 8, lane_mask(2 * count - 8), xy1);
    }
  }
}

// backward_block for float32: the same pipeline with the vectorized per-sample work.
void backward_block_fast(const Geometry& g, int64_t b, int64_t h0, int64_t h1, int64_t q0, int64_t q1,
                         const float* value, const float* loc, const float* attn, const float* grad, float* gv,
                         int64_t gv_stride, int64_t gv_head, float* gloc, float* gattn) {
  const int64_t heads = h1 - h0, total = (q1 - q0) * heads;
  if (total == 0) return;
  const LaneGeometry lg = make_lanes(g);
  FastUnit units[2];
  for (FastUnit& u : units) {
    u.tap.resize(4 * lg.padded + 8);  // each corner's 8-lane store may run 8 past the taps
    u.idx.resize(4 * lg.padded);
    u.lx.resize(lg.padded);
    u.ly.resize(lg.padded);
    u.a.resize(lg.padded);
    u.any.resize(lg.padded);
  }
  TapScratch<float> ts;
  ts.dots.assign(lg.zero_slot + 8, 0.f);
  ts.parts.resize(lg.zero_slot);
  const auto prepare = [&](int64_t i, FastUnit& u) {
    const int64_t q = q0 + i / heads, h = h0 + i % heads;
    prepare_fast(g, lg, b, q, h, value, loc, attn, gv + (h - h0) * gv_head, gv_stride, u);
  };
  prepare(0, units[0]);
  for (int64_t i = 0; i < total; ++i) {
    if (i + 1 < total) prepare(i + 1, units[(i + 1) & 1]);
    process_fast(g, lg, grad, gloc, gattn, units[i & 1], ts);
  }
}
#endif

// Zero the value-gradient rows of one work item: `rows` rows of D numbers, gv_stride apart. Done by
// the thread that then accumulates into them (first touch, parallel, cache-warm).
template <typename T>
void zero_rows(T* gv, int64_t rows, int64_t D, int64_t gv_stride) {
  if (gv_stride == D) {
    std::fill(gv, gv + rows * D, T(0));
    return;
  }
  for (int64_t k = 0; k < rows; ++k) std::fill(gv + k * gv_stride, gv + k * gv_stride + D, T(0));
}

// The forward into `out`: (bs, Q, M*D), contiguous, in the compute dtype.
void forward_into(const at::Tensor& value, const at::Tensor& spatial_shapes,
                  const at::Tensor& level_start_index, const at::Tensor& loc, const at::Tensor& attn,
                  at::Tensor& out) {
  const Geometry g = make_geometry(value, spatial_shapes, level_start_index, loc);
  if (out.numel() == 0) return;
  AT_DISPATCH_FLOATING_TYPES(value.scalar_type(), "multi_scale_deformable_attn", [&] {
    const scalar_t* v = value.data_ptr<scalar_t>();
    const scalar_t* lp = loc.data_ptr<scalar_t>();
    const scalar_t* ap = attn.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, g.bs * g.Q, 16, [&](int64_t begin, int64_t end) {
      forward_rows(g, v, lp, ap, op, begin, end);
    });
  });
}

at::Tensor forward(const at::Tensor& value_, const at::Tensor& spatial_shapes,
                   const at::Tensor& level_start_index, const at::Tensor& loc_,
                   const at::Tensor& attn_, int64_t /*im2col_step: a CUDA batching hint*/) {
  const at::ScalarType ct = compute_type(value_.scalar_type());
  const at::Tensor value = value_.to(ct).contiguous(), loc = loc_.to(ct).contiguous(),
                   attn = attn_.to(ct).contiguous();
  // every number is written: no zero-fill
  at::Tensor out = at::empty({value.size(0), loc.size(1), value.size(2) * value.size(3)}, value.options());
  forward_into(value, spatial_shapes, level_start_index, loc, attn, out);
  return out.to(value_.scalar_type());
}

// The forward written into a given output (ONNX Runtime's buffer, for the Python kernel): straight
// into it when it is contiguous in the compute dtype (float32 / float64), else through a temporary
// rounded once into it. Saves the result's allocation and the copy into ORT's output.
void forward_out(const at::Tensor& value_, const at::Tensor& spatial_shapes,
                 const at::Tensor& level_start_index, const at::Tensor& loc_, const at::Tensor& attn_,
                 int64_t im2col_step, at::Tensor out) {
  const at::ScalarType ct = compute_type(value_.scalar_type());
  const std::vector<int64_t> shape = {value_.size(0), loc_.size(1), value_.size(2) * value_.size(3)};
  TORCH_CHECK(out.sizes() == at::IntArrayRef(shape), "multi_scale_deformable_attn: out has shape ",
              out.sizes(), ", expected ", at::IntArrayRef(shape));
  if (out.scalar_type() != ct || !out.is_contiguous()) {
    out.copy_(forward(value_, spatial_shapes, level_start_index, loc_, attn_, im2col_step));
    return;
  }
  const at::Tensor value = value_.to(ct).contiguous(), loc = loc_.to(ct).contiguous(),
                   attn = attn_.to(ct).contiguous();
  forward_into(value, spatial_shapes, level_start_index, loc, attn, out);
}

std::vector<at::Tensor> backward(const at::Tensor& grad_, const at::Tensor& value_,
                                 const at::Tensor& spatial_shapes,
                                 const at::Tensor& level_start_index, const at::Tensor& loc_,
                                 const at::Tensor& attn_, int64_t /*im2col_step*/) {
  const at::ScalarType ct = compute_type(value_.scalar_type());
  const at::Tensor value = value_.to(ct).contiguous(), loc = loc_.to(ct).contiguous(),
                   attn = attn_.to(ct).contiguous(), grad = grad_.to(ct).contiguous();
  const Geometry g = make_geometry(value, spatial_shapes, level_start_index, loc);
  // No zero-fills here: the workers zero their own value-gradient rows and write every
  // location / weight gradient.
  at::Tensor grad_value = at::empty(value.sizes(), value.options());
  at::Tensor grad_loc = at::empty(loc.sizes(), value.options());
  at::Tensor grad_attn = at::empty(attn.sizes(), value.options());
  const auto result = [&]() -> std::vector<at::Tensor> {
    return {grad_value.to(value_.scalar_type()), grad_loc.to(loc_.scalar_type()),
            grad_attn.to(attn_.scalar_type())};
  };
  if (g.bs * g.Q * g.M * g.L * g.P == 0 || g.D == 0) {
    grad_value.zero_();
    grad_loc.zero_();
    grad_attn.zero_();
    return result();
  }
  const int64_t pairs = g.bs * g.M, threads = at::get_num_threads();
  // Work items own disjoint value gradients, so no two threads ever add into the same number:
  // (batch, block of heads) items, as many blocks per batch as it takes to feed the threads.
  // Fewer (b, h) pairs than threads: split each pair's queries instead, each split with its own
  // value gradient buffer (K x D), summed afterwards in split order. Results never depend on
  // thread timing.
  const int64_t splits = pairs >= threads ? 1 : std::min<int64_t>(g.Q, (threads + pairs - 1) / pairs);
  const int64_t blocks = splits > 1 ? g.M : std::min<int64_t>(g.M, (threads + g.bs - 1) / g.bs);
  const int64_t items = g.bs * blocks * splits;
  std::vector<at::Tensor> privates(splits > 1 ? items : 0);
  if (splits > 1) grad_value.zero_();
  AT_DISPATCH_FLOATING_TYPES(ct, "multi_scale_deformable_attn_backward", [&] {
    using T = scalar_t;
    const T* v = value.data_ptr<T>();
    const T* lp = loc.data_ptr<T>();
    const T* ap = attn.data_ptr<T>();
    const T* gp = grad.data_ptr<T>();
    T* gvp = grad_value.data_ptr<T>();
    T* glp = grad_loc.data_ptr<T>();
    T* gap = grad_attn.data_ptr<T>();
    const auto run_block = [&](int64_t b, int64_t h0, int64_t h1, int64_t q0, int64_t q1, T* gv, int64_t gv_stride,
                           int64_t gv_head) {
#if defined(__AVX2__) && defined(__FMA__)
      // The vectorized setup computes value rows in int32.
      if constexpr (std::is_same_v<T, float>) {
        if (g.K < (int64_t(1) << 30) && g.M * g.D * int64_t(sizeof(float)) < (int64_t(1) << 31)) {
          // (the casts only make the discarded double branch compile: T is float here)
          backward_block_fast(g, b, h0, h1, q0, q1, reinterpret_cast<const float*>(v),
                              reinterpret_cast<const float*>(lp), reinterpret_cast<const float*>(ap),
                              reinterpret_cast<const float*>(gp), reinterpret_cast<float*>(gv), gv_stride,
                              gv_head, reinterpret_cast<float*>(glp), reinterpret_cast<float*>(gap));
          return;
        }
      }
#endif
      backward_block(g, b, h0, h1, q0, q1, v, lp, ap, gp, gv, gv_stride, gv_head, glp, gap);
    };
    at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t block = item / splits, split = item % splits;
        const int64_t b = block / blocks, blk = block % blocks;
        const int64_t h0 = blk * g.M / blocks, h1 = (blk + 1) * g.M / blocks;
        const int64_t q0 = split * g.Q / splits, q1 = (split + 1) * g.Q / splits;
        if (splits == 1) {
          T* gv = gvp + b * g.K * g.M * g.D + h0 * g.D;
          zero_rows(gv, g.K, (h1 - h0) * g.D, g.M * g.D);
          run_block(b, h0, h1, q0, q1, gv, g.M * g.D, g.D);
        } else {  // one head per block
          privates[item] = at::zeros({g.K, g.D}, value.options());
          run_block(b, h0, h1, q0, q1, privates[item].data_ptr<T>(), g.D, int64_t(0));
        }
      }
    });
  });
  if (splits > 1) {
    for (int64_t item = 0; item < items; ++item) {
      const int64_t pair = item / splits;  // blocks == M: block = pair = b * M + h
      grad_value.select(0, pair / g.M).select(1, pair % g.M).add_(privates[item]);
    }
  }
  return result();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "multi_scale_deformable_attn forward (CPU)");
  m.def("forward_out", &forward_out, "multi_scale_deformable_attn forward into a given output (CPU)");
  m.def("backward", &backward,
        "multi_scale_deformable_attn backward (CPU): value, sampling_locations, attention_weights");
}
