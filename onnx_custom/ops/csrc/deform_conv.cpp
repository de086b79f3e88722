// deform_conv2d (torchvision semantics) for CPU: bilinear sampling into im2col columns, then one
// GEMM per group. Validation lives in Python (shared with the fake kernel); this file trusts its
// inputs: one floating dtype, shapes already checked. Any strides are accepted (dense copies are
// made where a kernel indexes flat). float16 and bfloat16 compute in float32: the image is
// widened while it is copied into the zero-bordered buffer, the small tensors up front, and
// results are rounded once at the end.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "onnx_custom/kernels/deform_conv.h"  // onnx_custom/runtime/include: shared with the native library

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace {

using onnx_custom_dcn::build_taps;
using onnx_custom_dcn::ForwardTaps;
using onnx_custom_dcn::Geometry;
using onnx_custom_dcn::kChannelsLastMinChannels;
using onnx_custom_dcn::PlaneTaps;
using onnx_custom_dcn::Segment;
using onnx_custom_dcn::segments;
using onnx_custom_dcn::Support;

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
  TORCH_CHECK((g.H + 3) * (g.W + 2) < (int64_t(1) << 31),
              "deform_conv2d: (H+2)*(W+2) must be below 2^31 (32-bit plane indices)");
  return g;
}

// The dtype the kernels compute in: float32 for the half types, else the input's own.
inline at::ScalarType compute_type(at::ScalarType t) {
  return (t == at::kHalf || t == at::kBFloat16) ? at::kFloat : t;
}

inline at::Tensor dense(const at::Tensor& t, at::ScalarType ct) {
  return t.to(ct).contiguous();
}

// Zero-bordered [N, C, H+3, W+2] copy of the input in the compute dtype (one pass: the copy
// converts and gathers any strides). Below the bottom border one more zero row: off-image taps
// point at the bottom border's first pixel, so all four of their corners read zeros (pointing
// them at pixel 0 read the image's first pixel as a corner: an Inf or NaN there made every
// off-image sample NaN, 0 * Inf, where torchvision gives 0).
inline at::Tensor padded_copy(const at::Tensor& input, at::ScalarType ct) {
  const int64_t H = input.size(2), W = input.size(3);
  at::Tensor padded = at::zeros({input.size(0), input.size(1), H + 3, W + 2},
                                input.options().dtype(ct));
  padded.slice(2, 1, H + 1).slice(3, 1, W + 1).copy_(input);
  return padded;
}

// Samples of one im2col row from one bordered plane (onnx_custom/kernels/deform_conv.h): AVX2
// gathers for float where the build targets AVX2 (-mavx2 -mfma where the CPU has them).
template <typename T>
inline void sample_row(const T* plane, int64_t Wp, const PlaneTaps<T>& tb, int64_t at, int64_t len,
                       T* row) {
  const int32_t* base = tb.base.data() + at;
  const T* top = tb.top.data() + 2 * at;
  const T* bottom = tb.bottom.data() + 2 * at;
#if defined(__AVX2__) && defined(__FMA__) && defined(ONNX_CUSTOM_DCN_AVX2)
  if constexpr (std::is_same_v<T, float>) {
    onnx_custom_dcn::sample_plane_row_gather(plane, Wp, base, top, bottom, len, row);
    return;
  }
#endif
  onnx_custom_dcn::sample_plane_row(plane, Wp, base, top, bottom, len, row);
}

// One tile of output positions [p0, p0 + len) of one image: cols[(c*K + k) * len + t] is the
// bilinear sample for channel c, tap k, position p0 + t. tb needs K * len entries.
template <typename T>
void im2col_tile(const Geometry& g, const T* padded, const T* off, const T* mask, int64_t p0,
                 int64_t len, PlaneTaps<T>& tb, T* cols) {
  const int64_t HWp = (g.H + 3) * (g.W + 2), Wp = g.W + 2;
  for (int64_t og = 0; og < g.offset_groups; ++og) {
    for (int64_t k = 0; k < g.K; ++k) {
      onnx_custom_dcn::build_plane_taps(g, off, mask, og, k, p0, len, tb, k * len);
    }
    for (int64_t c = og * g.cpog; c < (og + 1) * g.cpog; ++c) {
      for (int64_t k = 0; k < g.K; ++k) {
        sample_row(padded + c * HWp, Wp, tb, k * len, len, cols + (c * g.K + k) * len);
      }
    }
  }
}


// Tests turn the AVX-512 kernels off to run the portable paths on AVX-512 machines too.
bool avx512_disabled = false;

bool use_avx512() {
#ifdef ONNX_CUSTOM_DCN_AVX512  // defined by onnx_custom/kernels/deform_conv.h
  return onnx_custom_dcn::cpu_has_avx512f() && !avx512_disabled;
#else
  return false;
#endif
}

// A zero-bordered channels-last image [H+2, W+2, C] in the compute dtype, for one image at a
// time: only the border is zeroed (once); load() converts image n into the interior.
struct BorderedImage {
  at::Tensor buffer, interior;
  BorderedImage(const Geometry& g, const at::TensorOptions& opts)
      : buffer(at::empty({g.H + 2, g.W + 2, g.C}, opts)),
        interior(buffer.slice(0, 1, g.H + 1).slice(1, 1, g.W + 1)) {
    buffer.select(0, 0).zero_();
    buffer.select(0, g.H + 1).zero_();
    buffer.select(1, 0).zero_();
    buffer.select(1, g.W + 1).zero_();
  }
  void load(const at::Tensor& input, int64_t n) { interior.copy_(input[n].permute({1, 2, 0})); }
};

// ---- backward ---------------------------------------------------------------------------------
//
// The backward works channels-last: the bordered image is [H+2, W+2, C], so the four corners of a
// sample are four contiguous channel vectors, and one pass over a sample's channels computes,
// from the same corner reads, the im2col column (for the weight gradient), the offset and mask
// gradient sums, and scatters the input gradient into a bordered channels-last gradient image --
// all vectorized, no gathers. Columns are per position t, channels grouped as [group][tap][c],
// so each convolution group is one plain GEMM operand. Work items are (image, tile) pairs split
// into one contiguous chunk per thread, as in the forward.

// Backward taps of one tile, structure-of-arrays: the bordered-image pixel of the cell's top-left
// corner, the fractional parts and the mask value, for samples in the gradient support; base -1
// (and zeros) outside it, NaN included: such samples are skipped, nothing is read.
template <typename T>
struct GradTaps {
  std::vector<int64_t> base;
  std::vector<T> ly, lx, m;
  explicit GradTaps(int64_t n) : base(n), ly(n), lx(n), m(n) {}
};

// Backward taps of kernel tap k at positions [p0, p0 + len), stored at entries [at, at + len).
template <typename T>
void build_grad_taps(const Geometry& g, const T* off, const T* mask, int64_t og, int64_t k,
                     int64_t p0, int64_t len, GradTaps<T>& tp, int64_t at) {
  build_taps<Support::kGradient>(
      g, off, mask, og, k, p0, len, at,
      [&](int64_t i, int64_t base, T ly, T lx, T m) {
        tp.base[i] = base;
        tp.ly[i] = ly;
        tp.lx[i] = lx;
        tp.m[i] = m;
      },
      [&](int64_t i) {
        tp.base[i] = -1;
        tp.ly[i] = tp.lx[i] = tp.m[i] = T(0);
      });
}

// One sample over `count` channels. p00 / g00 point at the cell's top-left pixel (first channel)
// of the bordered image / gradient image; the other corners are one pixel (C) and one row
// (row = (W+2)*C) further. With gc the column gradient of each channel:
//   column = m * value,  value = (1-ly) * top + ly * bottom  (top/bottom: row interpolations)
//   sums: d/dy += gc * (bottom - top), d/dx += gc * ((1-ly)(v01-v00) + ly(v11-v10)),
//         d/dmask += gc * value  (the offset gradient is m * (d/dy, d/dx))
//   each corner of the gradient image += its bilinear weight * m * gc
template <typename T>
inline void sample_channels(const T* __restrict p00, T* __restrict g00, int64_t C, int64_t row,
                            int64_t count, T ly, T lx, T m, const T* __restrict gc,
                            T* __restrict col, T& sy, T& sx, T& sm) {
  const T hy = 1 - ly, hx = 1 - lx;
  const T* __restrict p01 = p00 + C;
  const T* __restrict p10 = p00 + row;
  const T* __restrict p11 = p10 + C;
  T ay = 0, ax = 0, am = 0;
#pragma omp simd reduction(+ : ay, ax, am)
  for (int64_t c = 0; c < count; ++c) {
    const T v00 = p00[c], v01 = p01[c], v10 = p10[c], v11 = p11[c];
    const T top = hx * v00 + lx * v01, bottom = hx * v10 + lx * v11;
    const T value = hy * top + ly * bottom;
    col[c] = m * value;
    ay += gc[c] * (bottom - top);
    ax += gc[c] * (hy * (v01 - v00) + ly * (v11 - v10));
    am += gc[c] * value;
  }
  sy += ay;
  sx += ax;
  sm += am;
  const T w00 = hy * hx * m, w01 = hy * lx * m, w10 = ly * hx * m, w11 = ly * lx * m;
  T* g01 = g00 + C;
  T* g10 = g00 + row;
  T* g11 = g10 + C;
  // The four corner ranges are disjoint (count <= C), so there is no dependence across c.
#pragma omp simd
  for (int64_t c = 0; c < count; ++c) {
    const T v = gc[c];
    g00[c] += w00 * v;
    g01[c] += w01 * v;
    g10[c] += w10 * v;
    g11[c] += w11 * v;
  }
}

// Per-thread buffers of the backward.
template <typename T>
struct BackwardScratch {
  at::Tensor gcols, cols;  // [tile, C*K]: column gradients / columns, [group][tap][c] per position
  at::Tensor gpadded;      // [H+2, W+2, C] input gradient of the current image (bordered)
  GradTaps<T> taps;        // K * tile taps of one offset group
  BackwardScratch(const Geometry& g, int64_t tile, const at::TensorOptions& opts)
      : gcols(at::empty({tile * g.C * g.K}, opts)), cols(at::empty({tile * g.C * g.K}, opts)),
        gpadded(at::zeros({g.H + 2, g.W + 2, g.C}, opts)), taps(g.K * tile) {}
};

// Everything of one tile [p0, p0 + len) of image n except the image-gradient flush. wt is the
// weight as [Cout, K * cin_g] ([tap][c] per output channel); gw accumulates in that layout.
template <typename T>
void backward_tile(const Geometry& g, int64_t n, int64_t p0, int64_t len, const at::Tensor& grad,
                   const at::Tensor& wt, const T* image, const T* off, const T* mask,
                   BackwardScratch<T>& s, at::Tensor& gw, T* grad_off, T* grad_mask) {
  const int64_t cin_g = g.C / g.groups, cout_g = g.Cout / g.groups, rows = cin_g * g.K;
  const int64_t CK = g.C * g.K, row = (g.W + 2) * g.C;
  const at::Tensor go = grad[n].view({g.Cout, g.P}).narrow(1, p0, len);
  at::Tensor gcols = s.gcols.narrow(0, 0, len * CK).view({len, CK});
  at::Tensor cols = s.cols.narrow(0, 0, len * CK).view({len, CK});
  for (int64_t grp = 0; grp < g.groups; ++grp) {
    at::Tensor out = gcols.narrow(1, grp * rows, rows);
    at::mm_out(out, go.narrow(0, grp * cout_g, cout_g).t(), wt.narrow(0, grp * cout_g, cout_g));
  }
  const T* gc = gcols.template data_ptr<T>();
  T* col = cols.template data_ptr<T>();
  T* gpad = s.gpadded.template data_ptr<T>();
  for (int64_t og = 0; og < g.offset_groups; ++og) {
    for (int64_t k = 0; k < g.K; ++k) {
      build_grad_taps(g, off, mask, og, k, p0, len, s.taps, k * len);
    }
    const std::vector<Segment> segs = segments(g, og);
    for (int64_t k = 0; k < g.K; ++k) {
      const int64_t ch = og * g.K + k;
      for (int64_t t = 0; t < len; ++t) {
        const int64_t i = k * len + t, base = s.taps.base[i];
        T sy = 0, sx = 0, sm = 0;
        for (const Segment& seg : segs) {
          const int64_t at = t * CK + seg.grp * rows + k * cin_g + seg.lo, count = seg.hi - seg.lo;
          if (base < 0) {
            std::fill_n(col + at, count, T(0));
            continue;
          }
          const int64_t pixel = base * g.C + seg.grp * cin_g + seg.lo;
          sample_channels(image + pixel, gpad + pixel, g.C, row, count, s.taps.ly[i],
                          s.taps.lx[i], s.taps.m[i], gc + at, col + at, sy, sx, sm);
        }
        const T m = s.taps.m[i];
        grad_off[(2 * ch) * g.P + p0 + t] = m * sy;
        grad_off[(2 * ch + 1) * g.P + p0 + t] = m * sx;
        if (g.use_mask) grad_mask[ch * g.P + p0 + t] = sm;
      }
    }
  }
  for (int64_t grp = 0; grp < g.groups; ++grp) {
    gw.narrow(0, grp * cout_g, cout_g)
        .addmm_(go.narrow(0, grp * cout_g, cout_g), cols.narrow(1, grp * rows, rows));
  }
}

at::Tensor forward(const at::Tensor& input_, const at::Tensor& weight_, const at::Tensor& offset_,
                   const at::Tensor& mask_, const at::Tensor& bias_, int64_t sh, int64_t sw,
                   int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t groups,
                   int64_t offset_groups, bool use_mask) {
  const at::ScalarType ct = compute_type(input_.scalar_type());
  const at::Tensor weight = dense(weight_, ct), offset = dense(offset_, ct),
                   bias = dense(bias_, ct);
  const at::Tensor mask = use_mask ? dense(mask_, ct) : mask_;
  const Geometry g = make_geometry(input_, weight, sh, sw, ph, pw, dh, dw, groups, offset_groups,
                                   use_mask);
  at::Tensor output = at::empty({g.N, g.Cout, g.Ho, g.Wo}, input_.options().dtype(ct));
  if (output.numel() == 0) return output.to(input_.scalar_type());
  const int64_t cin_g = g.C / groups, cout_g = g.Cout / groups;
  const at::Tensor out = output.view({g.N, g.Cout, g.P});
  const int64_t off_stride = 2 * g.offset_groups * g.K * g.P, mask_stride = off_stride / 2;
  // Worker threads do not inherit the caller's dispatch state (below-autograd, InferenceMode);
  // without it the ATen GEMMs below would see autograd keys and inference outputs would fail.
  const at::ThreadLocalState tls;
  if (g.cpog >= kChannelsLastMinChannels) {
    // Channels-last sampling (see im2col_cl_tile). Tiles of output positions keep a work item's
    // columns (tile x C*K) in L2 and let threads split (image, tile) pairs, sampling and GEMM
    // together, each thread on one contiguous run of pairs (no fork/join per tile). A thread
    // converts each image it meets into its own bordered channels-last buffer right before
    // sampling it, so the image is still in cache when sampled and no N-image copy is made (an
    // image split between threads is converted by each of them).
    constexpr int64_t kTile = onnx_custom_dcn::kChannelsLastTile;
    const int64_t tiles = (g.P + kTile - 1) / kTile, CK = g.C * g.K, rows = cin_g * g.K;
    const at::Tensor wt = weight.permute({0, 2, 3, 1}).reshape({g.Cout, -1}).contiguous();
    const bool avx512 = ct == at::kFloat && use_avx512();
#ifdef ONNX_CUSTOM_DCN_AVX512
    at::Tensor packed;
    if (avx512) {
      packed = at::empty({onnx_custom_dcn::packed_weight_size(g)}, wt.options());
      onnx_custom_dcn::pack_weight(g, wt.data_ptr<float>(), packed.data_ptr<float>());
    }
#endif
    AT_DISPATCH_FLOATING_TYPES(ct, "deform_conv2d_forward", [&] {
      using T = scalar_t;
      at::parallel_for(0, g.N * tiles, 1, [&](int64_t b0, int64_t b1) {
        at::ThreadLocalStateGuard tls_guard(tls);
        at::Tensor cols = at::empty({kTile * CK}, output.options());
        ForwardTaps<T> taps(g.K * kTile);
        BorderedImage image(g, output.options());
        int64_t current = -1;
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t n = b / tiles, p0 = (b % tiles) * kTile, len = std::min(kTile, g.P - p0);
          if (n != current) {
            image.load(input_, n);
            current = n;
          }
          onnx_custom_dcn::im2col_cl_tile(g, image.buffer.data_ptr<T>(),
                                          offset.data_ptr<T>() + n * off_stride,
                                          use_mask ? mask.data_ptr<T>() + n * mask_stride : nullptr,
                                          p0, len, taps, cols.data_ptr<T>(), avx512);
#ifdef ONNX_CUSTOM_DCN_AVX512
          if constexpr (std::is_same_v<T, float>) {
            if (avx512) {
              onnx_custom_dcn::gemm_tile(g, cols.data_ptr<float>(), len, packed.data_ptr<float>(),
                        bias.data_ptr<float>(), output.data_ptr<float>() + n * g.Cout * g.P + p0);
              continue;
            }
          }
#endif
          const at::Tensor c2 = cols.narrow(0, 0, len * CK).view({len, CK});
          for (int64_t grp = 0; grp < groups; ++grp) {
            at::Tensor o = out[n].narrow(0, grp * cout_g, cout_g).narrow(1, p0, len);
            at::addmm_out(o, bias.narrow(0, grp * cout_g, cout_g).unsqueeze(1),
                          wt.narrow(0, grp * cout_g, cout_g), c2.narrow(1, grp * rows, rows).t());
          }
        }
      });
    });
    return output.to(input_.scalar_type());
  }
  // Few channels per offset group: channel vectors are too short to pay for a channels-last
  // copy; sample each NCHW plane with gathers instead.
  constexpr int64_t kTile = 256;
  const int64_t tiles = (g.P + kTile - 1) / kTile;
  const at::Tensor padded = padded_copy(input_, ct);
  const at::Tensor w = weight.view({g.Cout, -1});
  AT_DISPATCH_FLOATING_TYPES(ct, "deform_conv2d_forward", [&] {
    at::parallel_for(0, g.N * tiles, 1, [&](int64_t b0, int64_t b1) {
      at::ThreadLocalStateGuard tls_guard(tls);
      at::Tensor cols = at::empty({g.C * g.K * kTile}, output.options());
      PlaneTaps<scalar_t> taps(g.K * kTile);
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t n = b / tiles, p0 = (b % tiles) * kTile, len = std::min(kTile, g.P - p0);
        const scalar_t* m = use_mask ? mask.data_ptr<scalar_t>() + n * mask_stride : nullptr;
        im2col_tile(g, padded.data_ptr<scalar_t>() + n * g.C * (g.H + 3) * (g.W + 2),
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
  return output.to(input_.scalar_type());
}

std::vector<at::Tensor> backward(const at::Tensor& grad_, const at::Tensor& input_,
                                 const at::Tensor& weight_, const at::Tensor& offset_,
                                 const at::Tensor& mask_, const at::Tensor& bias_, int64_t sh,
                                 int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                                 int64_t groups, int64_t offset_groups, bool use_mask) {
  const at::ScalarType ct = compute_type(input_.scalar_type());
  const at::Tensor grad = dense(grad_, ct), weight = dense(weight_, ct),
                   offset = dense(offset_, ct);
  const at::Tensor mask = use_mask ? dense(mask_, ct) : mask_;
  const Geometry g = make_geometry(input_, weight, sh, sw, ph, pw, dh, dw, groups, offset_groups,
                                   use_mask);
  const at::TensorOptions opts = input_.options().dtype(ct);
  // Every gradient is allocated dense: the kernels write them flat (zeros_like of a caller's
  // permuted mask would keep its strides and receive the values in the wrong places).
  at::Tensor grad_input = at::zeros({g.N, g.C, g.H, g.W}, opts);
  at::Tensor grad_offset = at::zeros(offset.sizes(), opts);
  at::Tensor grad_mask = at::zeros(mask_.sizes(), opts);
  at::Tensor grad_weight = at::zeros(weight.sizes(), opts);
  at::Tensor grad_bias = grad.sum({0, 2, 3});
  const auto result = [&]() -> std::vector<at::Tensor> {
    return {grad_input.to(input_.scalar_type()), grad_weight.to(weight_.scalar_type()),
            grad_offset.to(offset_.scalar_type()), grad_mask.to(mask_.scalar_type()),
            grad_bias.to(bias_.scalar_type())};
  };
  if (grad.numel() == 0) return result();
  constexpr int64_t kTile = 128;
  const int64_t tiles = (g.P + kTile - 1) / kTile, items = g.N * tiles;
  const int64_t chunks = std::min<int64_t>(at::get_num_threads(), items);
  // Bordered channels-last image, weight as [Cout, K * cin_g] ([tap][c] per output channel).
  at::Tensor padded = at::zeros({g.N, g.H + 2, g.W + 2, g.C}, opts);
  padded.slice(1, 1, g.H + 1).slice(2, 1, g.W + 1).copy_(input_.permute({0, 2, 3, 1}));
  const at::Tensor wt = weight.permute({0, 2, 3, 1}).reshape({g.Cout, -1}).contiguous();
  const auto interior = [&](const at::Tensor& bordered) {  // [H+2, W+2, C] -> [C, H, W] view
    return bordered.slice(0, 1, g.H + 1).slice(1, 1, g.W + 1).permute({2, 0, 1});
  };
  // Images a chunk covers only partly are accumulated privately and summed afterwards in chunk
  // order, as are the per-chunk weight gradients: results do not depend on thread timing.
  std::vector<std::vector<std::pair<int64_t, at::Tensor>>> partials(chunks);
  std::vector<at::Tensor> weight_parts(chunks);
  AT_DISPATCH_FLOATING_TYPES(ct, "deform_conv2d_backward", [&] {
    using T = scalar_t;
    const int64_t off_stride = 2 * g.offset_groups * g.K * g.P, mask_stride = off_stride / 2;
    const int64_t image_stride = (g.H + 2) * (g.W + 2) * g.C;
    const at::ThreadLocalState tls;  // see forward
    at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      at::ThreadLocalStateGuard tls_guard(tls);
      for (int64_t j = c0; j < c1; ++j) {
        const int64_t b0 = j * items / chunks, b1 = (j + 1) * items / chunks;
        BackwardScratch<T> s(g, kTile, opts);
        at::Tensor gw = at::zeros({g.Cout, wt.size(1)}, opts);
        int64_t current = -1;
        const auto flush = [&]() {
          if (current < 0) return;
          if (current * tiles >= b0 && (current + 1) * tiles <= b1) {  // the whole image is ours
            grad_input[current].copy_(interior(s.gpadded));
            s.gpadded.zero_();
          } else {
            partials[j].emplace_back(current, s.gpadded);
            s.gpadded = at::zeros_like(s.gpadded);
          }
        };
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t n = b / tiles, p0 = (b % tiles) * kTile, len = std::min(kTile, g.P - p0);
          if (n != current) {
            flush();
            current = n;
          }
          backward_tile(g, n, p0, len, grad, wt, padded.data_ptr<T>() + n * image_stride,
                        offset.data_ptr<T>() + n * off_stride,
                        use_mask ? mask.data_ptr<T>() + n * mask_stride : nullptr, s, gw,
                        grad_offset.data_ptr<T>() + n * off_stride,
                        use_mask ? grad_mask.data_ptr<T>() + n * mask_stride : nullptr);
        }
        flush();
        weight_parts[j] = gw;
      }
    });
  });
  for (const auto& chunk : partials) {
    for (const auto& [n, buf] : chunk) grad_input[n].add_(interior(buf));
  }
  at::Tensor gw_sum = weight_parts[0];
  for (size_t j = 1; j < weight_parts.size(); ++j) gw_sum = gw_sum + weight_parts[j];
  // [Cout, K, cin_g] -> [Cout, cin_g, kh, kw]
  grad_weight.copy_(gw_sum.view({g.Cout, g.K, g.C / groups}).permute({0, 2, 1})
                        .reshape(grad_weight.sizes()));
  return result();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "deform_conv2d forward (CPU)");
  m.def("disable_avx512", [](bool off) { avx512_disabled = off; },
        "tests: run the portable forward paths (at::addmm GEMM, compiler-vectorized sampling) even "
        "where the AVX-512 kernels would run");
  m.def("avx512", &use_avx512, "whether the float32 forward runs the AVX-512 kernels");
  m.def("backward", &backward, "deform_conv2d backward (CPU): input, weight, offset, mask, bias");
}
