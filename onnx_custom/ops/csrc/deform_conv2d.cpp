// deform_conv2d (torchvision semantics) for CPU: bilinear sampling into im2col columns, then one
// GEMM per group. Validation lives in Python (shared with the fake kernel); this file trusts its
// inputs: contiguous, same floating dtype, shapes already checked.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace {

struct Geometry {
  int64_t N, C, H, W, Cout, kh, kw, K, Ho, Wo, P;
  int64_t sh, sw, ph, pw, dh, dw, groups, offset_groups, cpog;
  bool use_mask;
};

Geometry make_geometry(const at::Tensor& input, const at::Tensor& weight, int64_t sh, int64_t sw,
                       int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t groups,
                       int64_t offset_groups, bool use_mask) {
  Geometry g;
  g.N = input.size(0); g.C = input.size(1); g.H = input.size(2); g.W = input.size(3);
  g.Cout = weight.size(0); g.kh = weight.size(2); g.kw = weight.size(3); g.K = g.kh * g.kw;
  g.Ho = (g.H + 2 * ph - (dh * (g.kh - 1) + 1)) / sh + 1;
  g.Wo = (g.W + 2 * pw - (dw * (g.kw - 1) + 1)) / sw + 1;
  g.P = g.Ho * g.Wo;
  g.sh = sh; g.sw = sw; g.ph = ph; g.pw = pw; g.dh = dh; g.dw = dw;
  g.groups = groups; g.offset_groups = offset_groups; g.cpog = g.C / offset_groups;
  g.use_mask = use_mask;
  return g;
}

// Taps used by the backward scatter (col2im): 4 flat plane indices and bilinear weights (mask
// folded in). Out-of-image corners get weight 0 and index 0, so nothing is out of bounds.
template <typename T>
struct Tap {
  int32_t idx[4];  // planes are checked to stay below 2^31 elements
  T w[4];
};

// Backward taps: corner indices (-1 when outside), fractional parts and the mask value.
template <typename T>
struct GradTap {
  int64_t idx[4];
  T ly, lx, m;
  bool inside;
};

// Sample position of kernel tap k at output position p for offset group og of image n.
template <typename T>
inline void sample_point(const Geometry& g, const T* off, int64_t og, int64_t k, int64_t p,
                         T* y, T* x) {
  const int64_t i = k / g.kw, j = k % g.kw, oh = p / g.Wo, ow = p % g.Wo;
  const T dy = off[(2 * (og * g.K + k)) * g.P + p];
  const T dx = off[(2 * (og * g.K + k) + 1) * g.P + p];
  *y = static_cast<T>(oh * g.sh - g.ph + i * g.dh) + dy;
  *x = static_cast<T>(ow * g.sw - g.pw + j * g.dw) + dx;
}

// torchvision's bilinear_interpolate support: zero unless -1 < y < H and -1 < x < W. Written as
// a negated conjunction so NaN coordinates land outside too.
template <typename T>
inline bool inside(T y, T x, int64_t H, int64_t W) {
  return y > T(-1) && y < static_cast<T>(H) && x > T(-1) && x < static_cast<T>(W);
}

template <typename T>
inline void corners(T y, T x, int64_t H, int64_t W, int64_t* idx, T* ly, T* lx) {
  const int64_t y0 = static_cast<int64_t>(std::floor(y));
  const int64_t x0 = static_cast<int64_t>(std::floor(x));
  *ly = y - static_cast<T>(y0);
  *lx = x - static_cast<T>(x0);
  const bool vy0 = y0 >= 0, vy1 = y0 + 1 <= H - 1, vx0 = x0 >= 0, vx1 = x0 + 1 <= W - 1;
  idx[0] = (vy0 && vx0) ? y0 * W + x0 : -1;
  idx[1] = (vy0 && vx1) ? y0 * W + x0 + 1 : -1;
  idx[2] = (vy1 && vx0) ? (y0 + 1) * W + x0 : -1;
  idx[3] = (vy1 && vx1) ? (y0 + 1) * W + x0 + 1 : -1;
}

// Taps for kp in [begin, end), written to taps[0 .. end - begin).
template <typename T>
void build_taps_range(const Geometry& g, const T* off, const T* mask, int64_t og, int64_t begin,
                      int64_t end, Tap<T>* taps) {
    for (int64_t kp = begin; kp < end; ++kp) {
      const int64_t k = kp / g.P, p = kp % g.P;
      Tap<T>& t = taps[kp - begin];
      T y, x;
      sample_point(g, off, og, k, p, &y, &x);
      for (int c = 0; c < 4; ++c) { t.idx[c] = 0; t.w[c] = T(0); }
      if (!inside(y, x, g.H, g.W)) continue;
      int64_t idx[4];
      T ly, lx;
      corners(y, x, g.H, g.W, idx, &ly, &lx);
      const T m = g.use_mask ? mask[(og * g.K + k) * g.P + p] : T(1);
      const T w[4] = {(1 - ly) * (1 - lx), (1 - ly) * lx, ly * (1 - lx), ly * lx};
      for (int c = 0; c < 4; ++c) {
        if (idx[c] >= 0) { t.idx[c] = static_cast<int32_t>(idx[c]); t.w[c] = w[c] * m; }
      }
    }
}

template <typename T>
void build_taps(const Geometry& g, const T* off, const T* mask, int64_t og, Tap<T>* taps) {
  at::parallel_for(0, g.K * g.P, 1024, [&](int64_t begin, int64_t end) {
    build_taps_range(g, off, mask, og, begin, end, taps + begin);
  });
}

template <typename T>
void build_grad_taps(const Geometry& g, const T* off, const T* mask, int64_t og, GradTap<T>* taps) {
  at::parallel_for(0, g.K * g.P, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t kp = begin; kp < end; ++kp) {
      const int64_t k = kp / g.P, p = kp % g.P;
      GradTap<T>& t = taps[kp];
      T y, x;
      sample_point(g, off, og, k, p, &y, &x);
      t.m = g.use_mask ? mask[(og * g.K + k) * g.P + p] : T(1);
      // The offset gradient is the derivative of the interpolation on the cell [floor(y),
      // floor(y)+1] x [floor(x), floor(x)+1] (torchvision's one-sided rule): non-zero while one
      // cell row and one cell column touch the image, i.e. on -1 <= y < H, -1 <= x < W, one
      // more line on each low side than the forward's support. NaN fails the test.
      t.inside = y >= T(-1) && y < static_cast<T>(g.H) && x >= T(-1) && x < static_cast<T>(g.W);
      t.ly = t.lx = T(0);
      for (int c = 0; c < 4; ++c) t.idx[c] = -1;
      if (t.inside) corners(y, x, g.H, g.W, t.idx, &t.ly, &t.lx);
    }
  });
}

// Forward taps on a zero-bordered image (H+2 x W+2), structure-of-arrays so the sampling loop
// vectorizes: per sample one base index (corners base, base+1, base+Wp, base+Wp+1 are always in
// bounds) and four bilinear weights with the mask folded in; off-image samples weigh 0.
// Weights are interleaved per row pair: top = (w00, w01), bottom = (w10, w11), matching the two
// adjacent pixels a 64-bit load fetches.
template <typename T>
struct TapBlock {
  std::vector<int32_t> base;
  std::vector<T> top, bottom;
  explicit TapBlock(int64_t n) : base(n), top(2 * n), bottom(2 * n) {}
};

// Taps of flat (k, p) indices [begin, end) stored at entries [at, at + end - begin).
template <typename T>
void build_pad_taps(const Geometry& g, const T* off, const T* mask, int64_t og, int64_t begin,
                    int64_t end, TapBlock<T>& tb, int64_t at) {
  const int64_t Wp = g.W + 2;
  for (int64_t kp = begin; kp < end; ++kp) {
    const int64_t k = kp / g.P, p = kp % g.P, i = at + kp - begin;
    T y, x;
    sample_point(g, off, og, k, p, &y, &x);
    if (!inside(y, x, g.H, g.W)) {
      tb.base[i] = 0;
      tb.top[2 * i] = tb.top[2 * i + 1] = tb.bottom[2 * i] = tb.bottom[2 * i + 1] = T(0);
      continue;
    }
    const int64_t y0 = static_cast<int64_t>(std::floor(y)), x0 = static_cast<int64_t>(std::floor(x));
    const T ly = y - static_cast<T>(y0), lx = x - static_cast<T>(x0);
    const T m = g.use_mask ? mask[(og * g.K + k) * g.P + p] : T(1);
    tb.base[i] = static_cast<int32_t>((y0 + 1) * Wp + (x0 + 1));
    tb.top[2 * i] = (1 - ly) * (1 - lx) * m;
    tb.top[2 * i + 1] = (1 - ly) * lx * m;
    tb.bottom[2 * i] = ly * (1 - lx) * m;
    tb.bottom[2 * i + 1] = ly * lx * m;
  }
}

// row[i] = bilinear sample of one padded plane at taps [at, at + len).
template <typename T>
inline void sample_row(const T* __restrict plane, int64_t Wp, const TapBlock<T>& tb, int64_t at,
                       int64_t len, T* __restrict row) {
  const int32_t* __restrict base = tb.base.data() + at;
  const T* __restrict top = tb.top.data() + 2 * at;
  const T* __restrict bottom = tb.bottom.data() + 2 * at;
  const int32_t wp = static_cast<int32_t>(Wp);
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_same_v<T, float>) {
    // 8 samples per step: each pixel pair (q[b], q[b+1]) is one 64-bit gather lane, so 4
    // four-lane gathers fetch all 32 corners; pair sums then collapse with one hadd.
    const __m128i wpv = _mm_set1_epi32(wp);
    const auto* plane64 = reinterpret_cast<const long long*>(plane);
    for (; i + 8 <= len; i += 8) {
      const __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(base + i));
      const __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(base + i + 4));
      const __m256 t0 = _mm256_castsi256_ps(_mm256_i32gather_epi64(plane64, b0, 4));
      const __m256 t1 = _mm256_castsi256_ps(_mm256_i32gather_epi64(plane64, b1, 4));
      const __m256 d0 =
          _mm256_castsi256_ps(_mm256_i32gather_epi64(plane64, _mm_add_epi32(b0, wpv), 4));
      const __m256 d1 =
          _mm256_castsi256_ps(_mm256_i32gather_epi64(plane64, _mm_add_epi32(b1, wpv), 4));
      const __m256 s0 = _mm256_fmadd_ps(d0, _mm256_loadu_ps(bottom + 2 * i),
                                        _mm256_mul_ps(t0, _mm256_loadu_ps(top + 2 * i)));
      const __m256 s1 = _mm256_fmadd_ps(d1, _mm256_loadu_ps(bottom + 2 * i + 8),
                                        _mm256_mul_ps(t1, _mm256_loadu_ps(top + 2 * i + 8)));
      // hadd gives (o0 o1 o4 o5 | o2 o3 o6 o7); reorder the 64-bit lanes to (o0 .. o7).
      const __m256 h = _mm256_hadd_ps(s0, s1);
      _mm256_storeu_ps(row + i, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(h), 0xD8)));
    }
  }
#endif
  for (; i < len; ++i) {
    const int32_t b = base[i];
    row[i] = (top[2 * i] * plane[b] + top[2 * i + 1] * plane[b + 1]) +
             (bottom[2 * i] * plane[b + wp] + bottom[2 * i + 1] * plane[b + wp + 1]);
  }
}

// columns[c * K + k, p] = bilinear sample of channel c for the channels of one offset group.
// Threads split the (k, p) range; each builds the taps of its chunk once into a small local
// buffer (stays in L1) and sweeps every channel of the group with it.
template <typename T>
void im2col(const Geometry& g, const T* padded, const T* off, const T* mask, int64_t og,
            T* columns) {
  const int64_t HWp = (g.H + 2) * (g.W + 2), Wp = g.W + 2, KP = g.K * g.P;
  constexpr int64_t kChunk = 512;
  at::parallel_for(0, (KP + kChunk - 1) / kChunk, 1, [&](int64_t b0, int64_t b1) {
    TapBlock<T> tb(kChunk);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t begin = b * kChunk, end = std::min(KP, begin + kChunk);
      build_pad_taps(g, off, mask, og, begin, end, tb, 0);
      for (int64_t c = og * g.cpog; c < (og + 1) * g.cpog; ++c) {
        sample_row(padded + c * HWp, Wp, tb, 0, end - begin, columns + c * KP + begin);
      }
    }
  });
}

// One tile of output positions [p0, p0 + len) of one image: cols[(c*K + k) * len + t] is the
// bilinear sample for channel c, tap k, position p0 + t. tb needs K * len entries.
template <typename T>
void im2col_tile(const Geometry& g, const T* padded, const T* off, const T* mask, int64_t p0,
                 int64_t len, TapBlock<T>& tb, T* cols) {
  const int64_t HWp = (g.H + 2) * (g.W + 2), Wp = g.W + 2;
  for (int64_t og = 0; og < g.offset_groups; ++og) {
    for (int64_t k = 0; k < g.K; ++k) {
      build_pad_taps(g, off, mask, og, k * g.P + p0, k * g.P + p0 + len, tb, k * len);
    }
    for (int64_t c = og * g.cpog; c < (og + 1) * g.cpog; ++c) {
      for (int64_t k = 0; k < g.K; ++k) {
        sample_row(padded + c * HWp, Wp, tb, k * len, len, cols + (c * g.K + k) * len);
      }
    }
  }
}

// Copies image n into the interior of a zero-bordered [C, H+2, W+2] buffer (border stays 0).
inline void pad_into(const at::Tensor& input, int64_t n, at::Tensor& padded) {
  const int64_t H = input.size(2), W = input.size(3);
  padded.slice(1, 1, H + 1).slice(2, 1, W + 1).copy_(input[n]);
}

// Adjoint of im2col: scatter column gradients back to the image (channels are disjoint per thread).
template <typename T>
void col2im(const Geometry& g, const T* grad_columns, const Tap<T>* taps, int64_t og,
            T* grad_image) {
  const int64_t HW = g.H * g.W;
  at::parallel_for(og * g.cpog, (og + 1) * g.cpog, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      T* plane = grad_image + c * HW;
      const T* gcol = grad_columns + c * g.K * g.P;
      for (int64_t kp = 0; kp < g.K * g.P; ++kp) {
        const Tap<T>& t = taps[kp];
        const T gc = gcol[kp];
        for (int i = 0; i < 4; ++i) plane[t.idx[i]] += t.w[i] * gc;
      }
    }
  });
}

// Gradients w.r.t. the sampling coordinates (offset) and the mask, summed over the channels of
// one offset group.
template <typename T>
void coord_grads(const Geometry& g, const T* image, const T* grad_columns,
                 const GradTap<T>* taps, int64_t og, T* grad_off, T* grad_mask) {
  const int64_t HW = g.H * g.W;
  at::parallel_for(0, g.K * g.P, 256, [&](int64_t begin, int64_t end) {
    std::vector<T> gy(end - begin, T(0)), gx(end - begin, T(0)), gm(end - begin, T(0));
    for (int64_t c = og * g.cpog; c < (og + 1) * g.cpog; ++c) {
      const T* plane = image + c * HW;
      const T* gcol = grad_columns + c * g.K * g.P;
      for (int64_t kp = begin; kp < end; ++kp) {
        const GradTap<T>& t = taps[kp];
        if (!t.inside) continue;
        T v[4];
        for (int i = 0; i < 4; ++i) v[i] = t.idx[i] >= 0 ? plane[t.idx[i]] : T(0);
        const T gc = gcol[kp], ly = t.ly, lx = t.lx, hy = 1 - ly, hx = 1 - lx;
        gy[kp - begin] += gc * (hx * (v[2] - v[0]) + lx * (v[3] - v[1]));
        gx[kp - begin] += gc * (hy * (v[1] - v[0]) + ly * (v[3] - v[2]));
        gm[kp - begin] += gc * (hy * hx * v[0] + hy * lx * v[1] + ly * hx * v[2] + ly * lx * v[3]);
      }
    }
    for (int64_t kp = begin; kp < end; ++kp) {
      const int64_t k = kp / g.P, p = kp % g.P;
      const T m = taps[kp].m;
      grad_off[(2 * (og * g.K + k)) * g.P + p] = m * gy[kp - begin];
      grad_off[(2 * (og * g.K + k) + 1) * g.P + p] = m * gx[kp - begin];
      if (g.use_mask) grad_mask[(og * g.K + k) * g.P + p] = gm[kp - begin];
    }
  });
}

at::Tensor forward(const at::Tensor& input_, const at::Tensor& weight_, const at::Tensor& offset_,
                   const at::Tensor& mask_, const at::Tensor& bias_, int64_t sh, int64_t sw,
                   int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t groups,
                   int64_t offset_groups, bool use_mask) {
  const at::Tensor input = input_.contiguous(), weight = weight_.contiguous(),
                   offset = offset_.contiguous(), bias = bias_.contiguous();
  const at::Tensor mask = use_mask ? mask_.contiguous() : mask_;
  const Geometry g = make_geometry(input, weight, sh, sw, ph, pw, dh, dw, groups, offset_groups,
                                   use_mask);
  TORCH_CHECK((g.H + 2) * (g.W + 2) < (int64_t(1) << 31),
              "deform_conv2d: (H+2)*(W+2) must be below 2^31 (32-bit plane indices)");
  at::Tensor output = at::empty({g.N, g.Cout, g.Ho, g.Wo}, input.options());
  if (output.numel() == 0) return output;
  // Tiles of output positions keep the columns of one work item in L2 and let threads split
  // (image, tile) pairs, sampling and GEMM together.
  constexpr int64_t kTile = 256;
  const int64_t tiles = (g.P + kTile - 1) / kTile, cin_g = g.C / groups, cout_g = g.Cout / groups;
  at::Tensor padded = at::zeros({g.N, g.C, g.H + 2, g.W + 2}, input.options());
  padded.slice(2, 1, g.H + 1).slice(3, 1, g.W + 1).copy_(input);
  const at::Tensor w = weight.view({g.Cout, -1});
  const at::Tensor out = output.view({g.N, g.Cout, g.P});
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "deform_conv2d_forward", [&] {
    const int64_t off_stride = 2 * g.offset_groups * g.K * g.P, mask_stride = off_stride / 2;
    // Worker threads do not inherit the caller's dispatch state (below-autograd, InferenceMode);
    // without it the ATen GEMMs below would see autograd keys and inference outputs would fail.
    const at::ThreadLocalState tls;
    at::parallel_for(0, g.N * tiles, 1, [&](int64_t b0, int64_t b1) {
      at::ThreadLocalStateGuard tls_guard(tls);
      at::Tensor cols = at::empty({g.C * g.K * kTile}, input.options());
      TapBlock<scalar_t> taps(g.K * kTile);
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t n = b / tiles, p0 = (b % tiles) * kTile, len = std::min(kTile, g.P - p0);
        const scalar_t* m = use_mask ? mask.data_ptr<scalar_t>() + n * mask_stride : nullptr;
        im2col_tile(g, padded.data_ptr<scalar_t>() + n * g.C * (g.H + 2) * (g.W + 2),
                    offset.data_ptr<scalar_t>() + n * off_stride, m, p0, len, taps,
                    cols.data_ptr<scalar_t>());
        const at::Tensor c2 = cols.narrow(0, 0, g.C * g.K * len).view({g.C * g.K, len});
        for (int64_t grp = 0; grp < groups; ++grp) {
          at::Tensor o = out[n].narrow(0, grp * cout_g, cout_g).narrow(1, p0, len);
          at::addmm_out(o, bias.narrow(0, grp * cout_g, cout_g).unsqueeze(1),
                        w.narrow(0, grp * cout_g, cout_g),
                        c2.narrow(0, grp * cin_g * g.K, cin_g * g.K));
        }
      }
    });
  });
  return output;
}

std::vector<at::Tensor> backward(const at::Tensor& grad_, const at::Tensor& input_,
                                 const at::Tensor& weight_, const at::Tensor& offset_,
                                 const at::Tensor& mask_, const at::Tensor& bias_, int64_t sh,
                                 int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                                 int64_t groups, int64_t offset_groups, bool use_mask) {
  const at::Tensor grad = grad_.contiguous(), input = input_.contiguous(),
                   weight = weight_.contiguous(), offset = offset_.contiguous();
  const at::Tensor mask = use_mask ? mask_.contiguous() : mask_;
  const Geometry g = make_geometry(input, weight, sh, sw, ph, pw, dh, dw, groups, offset_groups,
                                   use_mask);
  TORCH_CHECK((g.H + 2) * (g.W + 2) < (int64_t(1) << 31),
              "deform_conv2d: (H+2)*(W+2) must be below 2^31 (32-bit plane indices)");
  at::Tensor grad_input = at::zeros_like(input);
  at::Tensor grad_offset = at::zeros_like(offset);
  // From the contiguous copy: the kernels below write it densely (zeros_like(mask_) would keep a
  // caller's permuted strides and receive the values in the wrong places).
  at::Tensor grad_mask = at::zeros_like(use_mask ? mask : mask_, at::MemoryFormat::Contiguous);
  at::Tensor grad_weight = at::zeros_like(weight);
  at::Tensor grad_bias = grad.sum({0, 2, 3}).to(bias_.dtype());
  if (grad.numel() == 0) return {grad_input, grad_weight, grad_offset, grad_mask, grad_bias};
  at::Tensor columns = at::empty({g.C * g.K, g.P}, input.options());
  at::Tensor grad_columns = at::empty({g.C * g.K, g.P}, input.options());
  at::Tensor padded = at::zeros({g.C, g.H + 2, g.W + 2}, input.options());
  const at::Tensor w = weight.view({groups, g.Cout / groups, -1});
  at::Tensor gw = grad_weight.view({groups, g.Cout / groups, -1});
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "deform_conv2d_backward", [&] {
    std::vector<Tap<scalar_t>> taps(g.K * g.P);
    std::vector<GradTap<scalar_t>> grad_taps(g.K * g.P);
    const int64_t off_stride = 2 * g.offset_groups * g.K * g.P, mask_stride = off_stride / 2;
    for (int64_t n = 0; n < g.N; ++n) {
      pad_into(input, n, padded);
      const scalar_t* image = input.data_ptr<scalar_t>() + n * g.C * g.H * g.W;
      const scalar_t* off = offset.data_ptr<scalar_t>() + n * off_stride;
      const scalar_t* m = use_mask ? mask.data_ptr<scalar_t>() + n * mask_stride : nullptr;
      const at::Tensor go = grad[n].view({groups, g.Cout / groups, g.P});
      at::Tensor gcols = grad_columns.view({groups, -1, g.P});
      at::bmm_out(gcols, w.transpose(1, 2), go);
      for (int64_t og = 0; og < g.offset_groups; ++og) {
        build_taps(g, off, m, og, taps.data());
        im2col(g, padded.data_ptr<scalar_t>(), off, m, og, columns.data_ptr<scalar_t>());
        col2im(g, grad_columns.data_ptr<scalar_t>(), taps.data(), og,
               grad_input.data_ptr<scalar_t>() + n * g.C * g.H * g.W);
        build_grad_taps(g, off, m, og, grad_taps.data());
        coord_grads(g, image, grad_columns.data_ptr<scalar_t>(), grad_taps.data(), og,
                    grad_offset.data_ptr<scalar_t>() + n * off_stride,
                    use_mask ? grad_mask.data_ptr<scalar_t>() + n * mask_stride : nullptr);
      }
      gw.baddbmm_(go, columns.view({groups, -1, g.P}).transpose(1, 2));
    }
  });
  return {grad_input, grad_weight, grad_offset, grad_mask, grad_bias};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "deform_conv2d forward (CPU)");
  m.def("backward", &backward, "deform_conv2d backward (CPU): input, weight, offset, mask, bias");
}
