// deform_conv2d's torch-free CPU kernels, shared by the eager op (onnx_custom/ops/csrc/deform_conv.cpp)
// and the native ORT kernel (ort_kernels/native/deform_conv.cpp), both including it as
// "onnx_custom/kernels/deform_conv.h": one copy of the tap builder, the channels-last forward
// sampler and the AVX-512 forward GEMM, so the compiled graph runs exactly the eager op's math. It
// lives in the runtime layer's include folder, below both of its users in the layer order.
//
// Plain C++17 and <immintrin.h>; no torch, no ONNX Runtime. Each library includes this header from
// one source file; everything sits in an anonymous namespace so neither library exports (or picks
// up the other's) copies of these functions when both are loaded in one process.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

// GCC and clang on x86-64 compile the AVX2 and AVX-512 kernels (target attributes) whatever -m
// flags the build uses; they run only where the CPU has the ISA (checked at run time by the
// caller, or at compile time where the build targets it).
#if defined(__GNUC__) && defined(__x86_64__)
#define ONNX_CUSTOM_DCN_AVX512 1
#define ONNX_CUSTOM_DCN_AVX2 1
#include <immintrin.h>
#endif

// `#pragma omp simd` where the build has OpenMP (the eager op's -fopenmp); the native library's
// plain -O3 vectorizes these loops on its own (restrict pointers) and would warn on the pragma.
#ifdef _OPENMP
#define ONNX_CUSTOM_DCN_SIMD _Pragma("omp simd")
#else
#define ONNX_CUSTOM_DCN_SIMD
#endif

namespace onnx_custom_dcn {
namespace {

// The sizes and attributes of one call (torchvision's deform_conv2d; validated by the caller).
struct Geometry {
  int64_t N, C, H, W, Cout, kh, kw, K, Ho, Wo, P;
  int64_t sh, sw, ph, pw, dh, dw, groups, offset_groups, cpog;
  bool use_mask;
};

// Which samples a tap table keeps. kForward: torchvision's bilinear_interpolate support, -1 < y < H
// and -1 < x < W. kGradient: torchvision's offset-gradient support, -1 <= y < H and -1 <= x < W,
// one more line on each low side (on those lines the cell puts all weight on the zero border, so
// the forward value, the column and the input gradient stay zero there, but the derivative from
// above does not). Both are conjunctions of comparisons, so NaN coordinates land outside.
enum class Support { kForward, kGradient };

// floor(v) as an integer for a finite v >= -1 (inside either support): truncate, then step down
// below zero. Same value as std::floor, without its libm call where the build's baseline ISA has
// no rounding instruction (the native library's plain x86-64: ~2 calls per sample, measured 15%
// of its forward at 64 channels).
template <typename T>
inline int64_t floor_index(T v) {
  const int64_t t = static_cast<int64_t>(v);
  return static_cast<T>(t) > v ? t - 1 : t;
}

// The one tap builder of every table (gather forward, channels-last forward, backward, the native
// kernel's): the cells of kernel tap k at output positions [p0, p0 + len) of offset group og. For
// entry i = at + t, inside(i, base, ly, lx, m) gets the bordered-image pixel (W+2 per row) of the
// cell's top-left corner, the fractional parts and the mask value; outside(i) a sample outside
// `support`. The tables differ only in what they store. The output row and column advance
// incrementally: no integer division per sample.
template <Support support, typename T, typename Inside, typename Outside>
inline void build_taps(const Geometry& g, const T* off, const T* mask, int64_t og, int64_t k,
                       int64_t p0, int64_t len, int64_t at, Inside&& inside, Outside&& outside) {
  const int64_t ki = k / g.kw, kj = k % g.kw;
  const T* dy = off + (2 * (og * g.K + k)) * g.P;
  const T* dx = dy + g.P;
  const T* mk = g.use_mask ? mask + (og * g.K + k) * g.P : nullptr;
  const T H = static_cast<T>(g.H), W = static_cast<T>(g.W);
  int64_t oh = p0 / g.Wo, ow = p0 % g.Wo;
  for (int64_t t = 0; t < len; ++t) {
    const int64_t p = p0 + t, i = at + t;
    const T y = static_cast<T>(oh * g.sh - g.ph + ki * g.dh) + dy[p];
    const T x = static_cast<T>(ow * g.sw - g.pw + kj * g.dw) + dx[p];
    if (++ow == g.Wo) {
      ow = 0;
      ++oh;
    }
    const bool in = support == Support::kForward
                        ? (y > T(-1) && y < H && x > T(-1) && x < W)
                        : (y >= T(-1) && y < H && x >= T(-1) && x < W);
    if (!in) {
      outside(i);
      continue;
    }
    const int64_t y0 = floor_index(y), x0 = floor_index(x);
    inside(i, (y0 + 1) * (g.W + 2) + (x0 + 1), y - static_cast<T>(y0), x - static_cast<T>(x0),
           mk != nullptr ? mk[p] : T(1));
  }
}

// Channels of one offset group split at convolution-group boundaries: [lo, hi) within group grp.
struct Segment {
  int64_t grp, lo, hi;
};

inline std::vector<Segment> segments(const Geometry& g, int64_t og) {
  const int64_t cin_g = g.C / g.groups;
  std::vector<Segment> out;
  for (int64_t c = og * g.cpog; c < (og + 1) * g.cpog;) {
    const int64_t grp = c / cin_g, end = std::min((og + 1) * g.cpog, (grp + 1) * cin_g);
    out.push_back({grp, c - grp * cin_g, end - grp * cin_g});
    c = end;
  }
  return out;
}

// ---- forward, per plane (the gather path) ---------------------------------------------------
//
// With few channels per offset group the forward samples each channel's zero-bordered NCHW plane
// ((H+3) x (W+2): one border pixel around the image and one more zero row below, so every corner
// of every tap is in bounds) with the taps of its offset group. Off-image taps point at the
// bottom border's first pixel, so all four of their corners read zeros (pointing them at pixel 0
// read the image's first pixel as a corner: an Inf or NaN there made every off-image sample NaN,
// 0 * Inf, where torchvision gives 0), with zero weights.

// Taps of one tile, structure-of-arrays so the sampling loop vectorizes: per sample the plane
// index of its top-left corner (corners base, base+1, base+Wp, base+Wp+1) and four bilinear
// weights with the mask folded in, interleaved per row pair: top = (w00, w01), bottom = (w10,
// w11), matching the two adjacent pixels a 64-bit load fetches.
template <typename T>
struct PlaneTaps {
  std::vector<int32_t> base;
  std::vector<T> top, bottom;
  PlaneTaps() = default;
  explicit PlaneTaps(int64_t n) { reserve(n); }
  void reserve(int64_t n) {  // grows only (a thread's scratch serves calls of any size)
    if (static_cast<int64_t>(base.size()) < n) {
      base.resize(n);
      top.resize(2 * n);
      bottom.resize(2 * n);
    }
  }
};

// Forward taps of kernel tap k at positions [p0, p0 + len), stored at entries [at, at + len).
template <typename T>
void build_plane_taps(const Geometry& g, const T* off, const T* mask, int64_t og, int64_t k,
                      int64_t p0, int64_t len, PlaneTaps<T>& t, int64_t at) {
  const int32_t zeros = static_cast<int32_t>((g.H + 1) * (g.W + 2));
  build_taps<Support::kForward>(
      g, off, mask, og, k, p0, len, at,
      [&](int64_t i, int64_t base, T ly, T lx, T m) {
        const T hy = T(1) - ly, hx = T(1) - lx;
        t.base[i] = static_cast<int32_t>(base);
        t.top[2 * i] = hy * hx * m;
        t.top[2 * i + 1] = hy * lx * m;
        t.bottom[2 * i] = ly * hx * m;
        t.bottom[2 * i + 1] = ly * lx * m;
      },
      [&](int64_t i) {
        t.base[i] = zeros;
        t.top[2 * i] = t.top[2 * i + 1] = t.bottom[2 * i] = t.bottom[2 * i + 1] = T(0);
      });
}

// row[i] = the bilinear sample of one bordered plane (rows Wp apart) at taps i of (base, top,
// bottom), i < len.
template <typename T>
inline void sample_plane_row(const T* __restrict plane, int64_t Wp, const int32_t* __restrict base,
                             const T* __restrict top, const T* __restrict bottom, int64_t len,
                             T* __restrict row) {
  for (int64_t i = 0; i < len; ++i) {
    const T* q = plane + base[i];
    row[i] = (top[2 * i] * q[0] + top[2 * i + 1] * q[1]) +
             (bottom[2 * i] * q[Wp] + bottom[2 * i + 1] * q[Wp + 1]);
  }
}

#ifdef ONNX_CUSTOM_DCN_AVX2
// Whether this CPU runs the AVX2 samplers below.
inline bool cpu_has_avx2_fma() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0 && __builtin_cpu_supports("fma") != 0;
  }();
  return yes;
}

// 8 bilinear samples from their corner pairs: t0/t1 hold the top pairs (x0, x0 + 1) of samples
// 0-3 / 4-7, d0/d1 the bottom pairs; top/bottom hold the matching interleaved weights.
__attribute__((target("avx2,fma"))) inline void blend8(__m256 t0, __m256 t1, __m256 d0, __m256 d1,
                                                       const float* top, const float* bottom,
                                                       float* row) {
  const __m256 s0 =
      _mm256_fmadd_ps(d0, _mm256_loadu_ps(bottom), _mm256_mul_ps(t0, _mm256_loadu_ps(top)));
  const __m256 s1 = _mm256_fmadd_ps(d1, _mm256_loadu_ps(bottom + 8),
                                    _mm256_mul_ps(t1, _mm256_loadu_ps(top + 8)));
  // hadd yields (o0 o1 o4 o5 | o2 o3 o6 o7); reorder the 64-bit lanes to (o0 .. o7)
  const __m256 h = _mm256_hadd_ps(s0, s1);
  _mm256_storeu_ps(row, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(h), 0xD8)));
}

// sample_plane_row for float, 8 samples per step: each horizontal pixel pair is one 64-bit gather
// lane, so four 4-lane gathers fetch all 32 corners; the pair sums collapse with one horizontal
// add.
__attribute__((target("avx2,fma"))) inline void sample_plane_row_gather(
    const float* plane, int64_t Wp, const int32_t* base, const float* top, const float* bottom,
    int64_t len, float* row) {
  const __m128i wp = _mm_set1_epi32(static_cast<int32_t>(Wp));
  const auto* pairs = reinterpret_cast<const long long*>(plane);
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(base + i));
    const __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(base + i + 4));
    const __m256 t0 = _mm256_castsi256_ps(_mm256_i32gather_epi64(pairs, b0, 4));
    const __m256 t1 = _mm256_castsi256_ps(_mm256_i32gather_epi64(pairs, b1, 4));
    const __m256 d0 = _mm256_castsi256_ps(_mm256_i32gather_epi64(pairs, _mm_add_epi32(b0, wp), 4));
    const __m256 d1 = _mm256_castsi256_ps(_mm256_i32gather_epi64(pairs, _mm_add_epi32(b1, wp), 4));
    blend8(t0, t1, d0, d1, top + 2 * i, bottom + 2 * i, row + i);
  }
  sample_plane_row(plane, Wp, base + i, top + 2 * i, bottom + 2 * i, len - i, row + i);
}

// The same 8 samples from plain 64-bit loads: each corner pair is one movq/movhps. On CPUs with
// slow gathers (AMD Zen) this is faster than the gathers.
__attribute__((target("avx2,fma"))) inline void sample_plane_row_pairs(
    const float* plane, int64_t Wp, const int32_t* base, const float* top, const float* bottom,
    int64_t len, float* row) {
  int64_t i = 0;
  const auto pair = [](const float* lo, const float* hi) {  // (lo[0], lo[1], hi[0], hi[1])
    double a, b;  // 8-byte loads from 4-byte aligned addresses: memcpy keeps them well defined
    std::memcpy(&a, lo, sizeof a);
    std::memcpy(&b, hi, sizeof b);
    return _mm_castpd_ps(_mm_set_pd(b, a));
  };
  for (; i + 8 <= len; i += 8) {
    const float* q[8];
    for (int j = 0; j < 8; ++j) q[j] = plane + base[i + j];
    const __m256 t0 = _mm256_set_m128(pair(q[2], q[3]), pair(q[0], q[1]));
    const __m256 t1 = _mm256_set_m128(pair(q[6], q[7]), pair(q[4], q[5]));
    const __m256 d0 = _mm256_set_m128(pair(q[2] + Wp, q[3] + Wp), pair(q[0] + Wp, q[1] + Wp));
    const __m256 d1 = _mm256_set_m128(pair(q[6] + Wp, q[7] + Wp), pair(q[4] + Wp, q[5] + Wp));
    blend8(t0, t1, d0, d1, top + 2 * i, bottom + 2 * i, row + i);
  }
  sample_plane_row(plane, Wp, base + i, top + 2 * i, bottom + 2 * i, len - i, row + i);
}
#endif

// ---- forward, channels-last ------------------------------------------------------------------
//
// The forward samples a bordered channels-last image [H+2, W+2, C]: a sample's four corners are
// four contiguous channel vectors, so one tap (its cell and four weights, mask folded in,
// computed once per (position, kernel tap) and offset group) serves all the channels of its
// offset group with plain vector loads and FMAs, no gathers. Columns are written per position t
// as [group][tap][c] (the backward's layout), so each convolution group's GEMM is
// weight [cout_g, K * cin_g] x columns^T.

// The forward samples channels-last from this many channels per offset group on (below, the
// channel vectors are too short to beat per-plane gathers). Tests run both paths.
constexpr int64_t kChannelsLastMinChannels = 8;
// Output positions per work item of the channels-last forward: a tile's columns (tile x C*K)
// stay in L2 between the sampler and the GEMM.
constexpr int64_t kChannelsLastTile = 128;

// Forward taps of one tile and offset group: the cell's top-left bordered pixel and its four
// bilinear weights times the mask; base -1 outside torchvision's forward support (NaN included).
template <typename T>
struct ForwardTaps {
  std::vector<int64_t> base;
  std::vector<T> w;  // 4 per tap: w00, w01, w10, w11
  ForwardTaps() = default;
  explicit ForwardTaps(int64_t n) : base(n), w(4 * n) {}
  void reserve(int64_t n) {  // grows only (a thread's scratch serves calls of any size)
    if (static_cast<int64_t>(base.size()) < n) {
      base.resize(n);
      w.resize(4 * n);
    }
  }
};

// Forward taps of kernel tap k at positions [p0, p0 + len), stored at entries [at, at + len).
template <typename T>
void build_forward_taps(const Geometry& g, const T* off, const T* mask, int64_t og, int64_t k,
                        int64_t p0, int64_t len, ForwardTaps<T>& tp, int64_t at) {
  build_taps<Support::kForward>(
      g, off, mask, og, k, p0, len, at,
      [&](int64_t i, int64_t base, T ly, T lx, T m) {
        tp.base[i] = base;
        T* w = tp.w.data() + 4 * i;
        w[0] = (1 - ly) * (1 - lx) * m;
        w[1] = (1 - ly) * lx * m;
        w[2] = ly * (1 - lx) * m;
        w[3] = ly * lx * m;
      },
      [&](int64_t i) { tp.base[i] = -1; });
}

// col[c] = bilinear sample of `count` channels; p00 is the cell's top-left pixel (first channel),
// the other corners are one pixel (C) and one bordered row (row) further.
template <typename T>
inline void sample_channels_forward(const T* __restrict p00, int64_t C, int64_t row, int64_t count,
                                    const T* w, T* __restrict col) {
  const T* __restrict p01 = p00 + C;
  const T* __restrict p10 = p00 + row;
  const T* __restrict p11 = p10 + C;
  const T w00 = w[0], w01 = w[1], w10 = w[2], w11 = w[3];
  ONNX_CUSTOM_DCN_SIMD
  for (int64_t c = 0; c < count; ++c) {
    col[c] = (w00 * p00[c] + w01 * p01[c]) + (w10 * p10[c] + w11 * p11[c]);
  }
}

// The sampling loop of im2col_cl_tile for one offset group: every (position, tap) of the tile
// through sample_channels_forward.
template <typename T>
void sample_cl_tile(const Geometry& g, const T* image, int64_t len, const ForwardTaps<T>& taps,
                    const std::vector<Segment>& segs, T* cols) {
  const int64_t cin_g = g.C / g.groups, rows = cin_g * g.K, CK = g.C * g.K;
  const int64_t row = (g.W + 2) * g.C;
  for (int64_t t = 0; t < len; ++t) {
    for (int64_t k = 0; k < g.K; ++k) {
      const int64_t i = k * len + t, base = taps.base[i];
      for (const Segment& seg : segs) {
        T* col = cols + t * CK + seg.grp * rows + k * cin_g + seg.lo;
        const int64_t count = seg.hi - seg.lo;
        if (base < 0) {
          std::fill_n(col, count, T(0));
          continue;
        }
        sample_channels_forward(image + base * g.C + seg.grp * cin_g + seg.lo, g.C, row, count,
                                taps.w.data() + 4 * i, col);
      }
    }
  }
}

#ifdef ONNX_CUSTOM_DCN_AVX512
// Whether this CPU runs the AVX-512 kernels below (each library adds its own switch to turn them
// off for tests).
inline bool cpu_has_avx512f() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return yes;
}

// sample_cl_tile for float with 16-channel AVX-512 vectors (a masked remainder): the compiler's
// loop was 8 wide (AVX2) and left ~1.7 of 12.7 ms of a forward (64 channels, 56x56, 1 thread)
// in this loop. (A lambda would not inherit the target attribute: the loop is spelled out.)
__attribute__((target("avx512f"))) void sample_cl_tile_avx512(const Geometry& g,
                                                               const float* image, int64_t len,
                                                               const ForwardTaps<float>& taps,
                                                               const std::vector<Segment>& segs,
                                                               float* cols) {
  const int64_t cin_g = g.C / g.groups, rows = cin_g * g.K, CK = g.C * g.K;
  const int64_t row = (g.W + 2) * g.C;
  for (int64_t t = 0; t < len; ++t) {
    for (int64_t k = 0; k < g.K; ++k) {
      const int64_t i = k * len + t, base = taps.base[i];
      const float* w = taps.w.data() + 4 * i;
      const __m512 w00 = _mm512_set1_ps(w[0]), w01 = _mm512_set1_ps(w[1]);
      const __m512 w10 = _mm512_set1_ps(w[2]), w11 = _mm512_set1_ps(w[3]);
      for (const Segment& seg : segs) {
        float* col = cols + t * CK + seg.grp * rows + k * cin_g + seg.lo;
        const int64_t count = seg.hi - seg.lo;
        if (base < 0) {
          std::fill_n(col, count, 0.0f);
          continue;
        }
        const float* p00 = image + base * g.C + seg.grp * cin_g + seg.lo;
        const float* p01 = p00 + g.C;
        const float* p10 = p00 + row;
        const float* p11 = p10 + g.C;
        int64_t c = 0;
        for (; c + 16 <= count; c += 16) {
          const __m512 top = _mm512_fmadd_ps(w01, _mm512_loadu_ps(p01 + c),
                                             _mm512_mul_ps(w00, _mm512_loadu_ps(p00 + c)));
          const __m512 bottom = _mm512_fmadd_ps(w11, _mm512_loadu_ps(p11 + c),
                                                _mm512_mul_ps(w10, _mm512_loadu_ps(p10 + c)));
          _mm512_storeu_ps(col + c, _mm512_add_ps(top, bottom));
        }
        if (c < count) {
          const __mmask16 m = static_cast<__mmask16>((1u << (count - c)) - 1);
          const __m512 top = _mm512_fmadd_ps(w01, _mm512_maskz_loadu_ps(m, p01 + c),
                                             _mm512_mul_ps(w00, _mm512_maskz_loadu_ps(m, p00 + c)));
          const __m512 bottom =
              _mm512_fmadd_ps(w11, _mm512_maskz_loadu_ps(m, p11 + c),
                              _mm512_mul_ps(w10, _mm512_maskz_loadu_ps(m, p10 + c)));
          _mm512_mask_storeu_ps(col + c, m, _mm512_add_ps(top, bottom));
        }
      }
    }
  }
}
#endif

// Columns of the tile [p0, p0 + len) of one image into cols [len, C*K] ([group][tap][c] per
// position). image is the bordered channels-last image; taps needs K * len entries. avx512: run
// the AVX-512 sampler (float only; the caller checked the CPU).
template <typename T>
void im2col_cl_tile(const Geometry& g, const T* image, const T* off, const T* mask, int64_t p0,
                    int64_t len, ForwardTaps<T>& taps, T* cols, bool avx512) {
  for (int64_t og = 0; og < g.offset_groups; ++og) {
    for (int64_t k = 0; k < g.K; ++k) {
      build_forward_taps(g, off, mask, og, k, p0, len, taps, k * len);
    }
    const std::vector<Segment> segs = segments(g, og);
#ifdef ONNX_CUSTOM_DCN_AVX512
    if constexpr (std::is_same_v<T, float>) {
      if (avx512) {
        sample_cl_tile_avx512(g, image, len, taps, segs, cols);
        continue;
      }
    }
#endif
    (void)avx512;
    sample_cl_tile(g, image, len, taps, segs, cols);
  }
}

// ---- forward GEMM, AVX-512 -------------------------------------------------------------------
//
// The channels-last forward's GEMM per tile is small (cout_g x K*cin_g by K*cin_g x tile) and runs
// once per tile. Through at::addmm (MKL, which takes its AVX2 path on AMD CPUs and repacks the
// weight on every call) it reached 80-85 GFLOP/s on one core of the 2-core EPYC; oneDNN's
// F.conv2d reaches ~107. This register-blocked kernel does the same ~107: 6 positions x 64 output
// channels in 24 zmm accumulators, the columns read as the sampler wrote them ([t][tap][c], one
// broadcast per position and column) and the weight packed once per call as [group][block of 64
// output channels][tap][c][64] (zero-padded), so the 64 channels of one column are 4 contiguous
// loads. It writes the NCHW output tile with the bias. The sum order is fixed (columns in order),
// so results do not depend on the thread count. Other CPUs, compilers and float64 use the
// caller's GEMM (at::addmm in the eager op, the native library's gemm()).
#ifdef ONNX_CUSTOM_DCN_AVX512
constexpr int64_t kGemmBlock = 64, kGemmRows = 6;

// out[c * ldo + i] = bias[c] + sum_k a[i * lda + k] * b[k * 64 + c] for MR positions i and the
// first `width` (<= 16 * NB) output channels c.
template <int MR, int NB>
__attribute__((target("avx512f"))) void gemm_block(const float* __restrict a, int64_t lda,
                                                   const float* __restrict b, int64_t depth,
                                                   const float* __restrict bias, int64_t width,
                                                   float* __restrict out, int64_t ldo) {
  __m512 acc[MR][NB];
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < depth; ++k) {
    __m512 bv[NB];
    for (int j = 0; j < NB; ++j) bv[j] = _mm512_loadu_ps(b + k * kGemmBlock + 16 * j);
    for (int i = 0; i < MR; ++i) {
      const __m512 av = _mm512_set1_ps(a[i * lda + k]);
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_fmadd_ps(av, bv[j], acc[i][j]);
    }
  }
  alignas(64) float tile[MR][16 * NB];
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NB; ++j) _mm512_store_ps(&tile[i][16 * j], acc[i][j]);
  }
  for (int64_t c = 0; c < width; ++c) {
    for (int i = 0; i < MR; ++i) out[c * ldo + i] = tile[i][c] + bias[c];
  }
}

template <int MR>
void gemm_rows(const float* a, int64_t lda, const float* b, int64_t depth, const float* bias,
               int64_t width, float* out, int64_t ldo) {
  switch ((width + 15) / 16) {
    case 1: gemm_block<MR, 1>(a, lda, b, depth, bias, width, out, ldo); break;
    case 2: gemm_block<MR, 2>(a, lda, b, depth, bias, width, out, ldo); break;
    case 3: gemm_block<MR, 3>(a, lda, b, depth, bias, width, out, ldo); break;
    default: gemm_block<MR, 4>(a, lda, b, depth, bias, width, out, ldo); break;
  }
}

// Floats pack_weight writes: [groups][blocks of 64 output channels][rows][64].
inline int64_t packed_weight_size(const Geometry& g) {
  const int64_t cout_g = g.Cout / g.groups, rows = g.C / g.groups * g.K;
  return g.groups * ((cout_g + kGemmBlock - 1) / kGemmBlock) * rows * kGemmBlock;
}

// The weight wt [Cout, rows] (rows = K * cin_g, [tap][c] per output channel, dense) packed for
// gemm_tile into dst (packed_weight_size floats); channels past cout_g in a block are zero.
inline void pack_weight(const Geometry& g, const float* wt, float* dst) {
  const int64_t cout_g = g.Cout / g.groups, rows = g.C / g.groups * g.K;
  const int64_t blocks = (cout_g + kGemmBlock - 1) / kGemmBlock;
  for (int64_t grp = 0; grp < g.groups; ++grp) {
    for (int64_t blk = 0; blk < blocks; ++blk) {
      float* b = dst + (grp * blocks + blk) * rows * kGemmBlock;
      const int64_t width = std::min(kGemmBlock, cout_g - blk * kGemmBlock);
      const float* src = wt + (grp * cout_g + blk * kGemmBlock) * rows;
      for (int64_t r = 0; r < rows; ++r) {
        float* dst_row = b + r * kGemmBlock;
        for (int64_t c = 0; c < width; ++c) dst_row[c] = src[c * rows + r];
        std::fill(dst_row + width, dst_row + kGemmBlock, 0.0f);
      }
    }
  }
}

// out[co * P + t] = bias + weight x columns for positions [0, len) of one tile: cols is
// [len][groups * rows], out points at the tile's first position of output channel 0.
inline void gemm_tile(const Geometry& g, const float* cols, int64_t len, const float* packed,
                      const float* bias, float* out) {
  const int64_t cout_g = g.Cout / g.groups, rows = g.C / g.groups * g.K, CK = g.C * g.K;
  const int64_t blocks = (cout_g + kGemmBlock - 1) / kGemmBlock;
  for (int64_t grp = 0; grp < g.groups; ++grp) {
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const float* b = packed + (grp * blocks + blk) * rows * kGemmBlock;
      const int64_t co = grp * cout_g + blk * kGemmBlock;
      const int64_t width = std::min(kGemmBlock, cout_g - blk * kGemmBlock);
      int64_t t = 0;
      for (; t + kGemmRows <= len; t += kGemmRows) {
        gemm_rows<kGemmRows>(cols + t * CK + grp * rows, CK, b, rows, bias + co, width,
                             out + co * g.P + t, g.P);
      }
      for (; t < len; ++t) {
        gemm_rows<1>(cols + t * CK + grp * rows, CK, b, rows, bias + co, width, out + co * g.P + t,
                     g.P);
      }
    }
  }
}
#endif

}  // namespace
}  // namespace onnx_custom_dcn
