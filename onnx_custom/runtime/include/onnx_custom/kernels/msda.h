// multi_scale_deformable_attn's bilinear sample, shared by the eager op
// (onnx_custom/ops/csrc/msda.cpp: forward, backward) and the native ORT kernel
// (ort_kernels/native/msda.cpp), both including it as "onnx_custom/kernels/msda.h": one definition
// of where a sampling location lands, which corners are inside the level and their weights. It
// lives in the runtime layer's include folder, below both of its users in the layer order. The
// eager op's float32 AVX2 backward setup (prepare_fast) computes the same cell 8 samples at a time.
// The native kernel's forward also takes the tap list and its register-blocked sum from here.
//
// The sample at (loc_x, loc_y) in [0, 1]^2 of an H x W level is grid_sample(align_corners=False,
// padding_mode="zeros") on grid 2 * loc - 1: the point (x, y) = (loc_x * W - 0.5, loc_y * H - 0.5),
// its cell's top-left corner (floor(x), floor(y)), the fractional parts, and the four corners
// (top-left, top-right, bottom-left, bottom-right) with zero padding outside the level.
//
// Plain C++17; no torch, no ONNX Runtime. Everything sits in an anonymous namespace so neither
// library exports (or picks up the other's) copies when both are loaded in one process.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define ONNX_CUSTOM_MSDA_X86 1
#include <immintrin.h>
#else
#define ONNX_CUSTOM_MSDA_X86 0
#endif

// Forced inlining, so a caller compiled for a wider instruction set (a target("avx2,fma") function)
// gets these loops vectorized for it rather than a call to the baseline copy.
#if defined(__GNUC__)
#define ONNX_CUSTOM_MSDA_INLINE inline __attribute__((always_inline))
#else
#define ONNX_CUSTOM_MSDA_INLINE inline
#endif

namespace onnx_custom_msda_math {
namespace {

// One sample's cell: corner c (0..3; dy = c >> 1, dx = c & 1) is key `row + dy * W + dx` of the
// value tensor when `in[c]`.
template <typename T>
struct Cell {
  int64_t row;
  T lx, ly;
  bool in[4];
};

// The cell of the sample at (loc_x, loc_y) on a level of H x W keys starting at key `start`.
// False when the sample contributes nothing: outside [-1, W] x [-1, H], not finite (the ordered
// comparisons are false for NaN, and floor() of a huge or NaN value never reaches the integer
// cast), or with no corner inside the level.
template <typename T>
ONNX_CUSTOM_MSDA_INLINE bool sample_cell(T loc_x, T loc_y, int64_t H, int64_t W, int64_t start, Cell<T>* c) {
  const T x = loc_x * static_cast<T>(W) - T(0.5), y = loc_y * static_cast<T>(H) - T(0.5);
  if (!(x >= T(-1) && x <= static_cast<T>(W) && y >= T(-1) && y <= static_cast<T>(H))) return false;
  const int64_t x0 = static_cast<int64_t>(std::floor(x)), y0 = static_cast<int64_t>(std::floor(y));
  c->lx = x - static_cast<T>(x0);
  c->ly = y - static_cast<T>(y0);
  c->row = start + y0 * W + x0;
  const bool x0_in = x0 >= 0 && x0 < W, x1_in = x0 + 1 >= 0 && x0 + 1 < W;
  const bool y0_in = y0 >= 0 && y0 < H, y1_in = y0 + 1 >= 0 && y0 + 1 < H;
  c->in[0] = y0_in && x0_in;
  c->in[1] = y0_in && x1_in;
  c->in[2] = y1_in && x0_in;
  c->in[3] = y1_in && x1_in;
  return c->in[0] || c->in[1] || c->in[2] || c->in[3];
}

// The key of corner `corner` of a cell on a level W keys wide.
template <typename T>
ONNX_CUSTOM_MSDA_INLINE int64_t corner_row(const Cell<T>& c, int corner, int64_t W) {
  return c.row + (corner >> 1) * W + (corner & 1);
}

// The four corners' bilinear weights (they sum to 1; a corner outside the level still gets its
// weight: the caller skips it).
template <typename T>
ONNX_CUSTOM_MSDA_INLINE void corner_weights(const Cell<T>& c, T* w) {
  const T hx = T(1) - c.lx, hy = T(1) - c.ly;
  w[0] = hy * hx;
  w[1] = hy * c.lx;
  w[2] = c.ly * hx;
  w[3] = c.ly * c.lx;
}

// One bilinear corner that contributes to a (query, head): the key (row of the value tensor) it
// reads and its weight (attention weight x bilinear weight). Corners outside the level are left
// out, so they add nothing even where value holds inf or NaN.
template <typename C>
struct Tap {
  int64_t key;
  C w;
};

// The taps of one (query, head), in the order (level, point, corner): `loc` holds its L * P
// (x, y) pairs, `attn` its L * P weights (storage type S, computed in C); level l has H[l] x W[l]
// keys from key start[l]. `taps` has room for 4 * L * P; returns how many were written.
template <typename C, typename S>
ONNX_CUSTOM_MSDA_INLINE int64_t list_taps(const S* loc, const S* attn, int64_t L, int64_t P, const int64_t* H,
                         const int64_t* W, const int64_t* start, Tap<C>* taps) {
  int64_t n = 0;
  Cell<C> cell;
  C w[4];
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t p = 0; p < P; ++p) {
      const int64_t s = l * P + p;
      const C x = static_cast<C>(loc[2 * s]), y = static_cast<C>(loc[2 * s + 1]);
      if (!sample_cell<C>(x, y, H[l], W[l], start[l], &cell)) continue;
      corner_weights(cell, w);
      const C a = static_cast<C>(attn[s]);
      for (int corner = 0; corner < 4; ++corner) {
        if (cell.in[corner]) taps[n++] = {corner_row(cell, corner, W[l]), a * w[corner]};
      }
    }
  }
  return n;
}

// out[0 : D] = sum over the taps of w * value row (row of key k: base + k * stride, D contiguous
// numbers), adding the taps in list order; an AVX2 caller keeps the same order per number.
template <typename C, typename V>
ONNX_CUSTOM_MSDA_INLINE void sum_taps(const Tap<C>* taps, int64_t n, const V* base, int64_t stride, int64_t D,
                                      C* __restrict out) {
  for (int64_t d = 0; d < D; ++d) out[d] = C(0);
  for (int64_t t = 0; t < n; ++t) {
    const V* __restrict v = base + taps[t].key * stride;
    const C w = taps[t].w;
    for (int64_t d = 0; d < D; ++d) out[d] += w * static_cast<C>(v[d]);
  }
}

#if ONNX_CUSTOM_MSDA_X86
// sum_taps for float32 with AVX2 + FMA (callers built for baseline x86-64 pick it at run time,
// has_avx2_fma): 32 head dims at a time in four 8-wide registers across all the taps, then 8 at a
// time, then the rest; per number the taps are added in list order, as sum_taps does.
__attribute__((target("avx2,fma"))) inline void sum_taps_avx2(const Tap<float>* taps, int64_t n,
                                                             const float* base, int64_t stride, int64_t D,
                                                             float* __restrict out) {
  int64_t d0 = 0;
  for (; d0 + 32 <= D; d0 += 32) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    for (int64_t t = 0; t < n; ++t) {
      const float* v = base + taps[t].key * stride + d0;
      const __m256 w = _mm256_set1_ps(taps[t].w);
      a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v), a0);
      a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8), a1);
      a2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 16), a2);
      a3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 24), a3);
    }
    _mm256_storeu_ps(out + d0, a0);
    _mm256_storeu_ps(out + d0 + 8, a1);
    _mm256_storeu_ps(out + d0 + 16, a2);
    _mm256_storeu_ps(out + d0 + 24, a3);
  }
  for (; d0 + 8 <= D; d0 += 8) {
    __m256 a0 = _mm256_setzero_ps();
    for (int64_t t = 0; t < n; ++t) {
      a0 = _mm256_fmadd_ps(_mm256_set1_ps(taps[t].w), _mm256_loadu_ps(base + taps[t].key * stride + d0), a0);
    }
    _mm256_storeu_ps(out + d0, a0);
  }
  for (int64_t d = d0; d < D; ++d) {
    float acc = 0.0f;
    for (int64_t t = 0; t < n; ++t) acc += taps[t].w * base[taps[t].key * stride + d];
    out[d] = acc;
  }
}

inline bool has_avx2_fma() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0 && __builtin_cpu_supports("fma") != 0;
  }();
  return yes;
}
#endif  // ONNX_CUSTOM_MSDA_X86

}  // namespace
}  // namespace onnx_custom_msda_math
