// onnx_custom::DeformConv2d: torchvision's deformable convolution (v1, and v2 with use_mask), the node
// emitted for deform_conv2d below opset 19. Inputs (input, weight, offset, mask, bias), INT
// attributes stride_h .. use_mask; semantics of ort_kernels/deform_conv.py and ops/deform_conv.py.
//
// Algorithm (the eager op's, without torch; onnx_custom/kernels/deform_conv.h holds the math both share).
// Output positions are cut into tiles; one thread-pool task per (image, tile) samples its im2col
// columns and multiplies them by the weights straight into the output rows. With at least 8
// channels per offset group the image is first converted to a zero-bordered channels-last copy
// and sampled 16 channels per vector (AVX-512) or by the compiler's loop, and the float GEMM is
// the eager op's AVX-512 kernel (our gemm() elsewhere). With fewer channels each zero-bordered
// NCHW plane is sampled with gathers (AVX2) into packed GEMM strips. float16/bfloat16 run in
// float32.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "onnx_custom/kernels/deform_conv.h"
#include "gemm.h"
#include "numeric.h"
#include "ort_gemm.h"

namespace oc {
namespace {

const std::vector<int> kFloats = {OC_ELEM_FLOAT, OC_ELEM_DOUBLE, OC_ELEM_FLOAT16, OC_ELEM_BFLOAT16};
constexpr int64_t kTile = 256;                 // output positions per task
constexpr int64_t kAttrLimit = int64_t(1) << 30;  // keeps every size computation inside int64

struct Params {
  int64_t sh, sw, ph, pw, dh, dw, groups, offset_groups;
  bool use_mask;
};

// The shared geometry (sizes and attributes) plus what the gather path indexes with.
struct Geometry : onnx_custom_dcn::Geometry {
  int64_t cin_g, cout_g;
  int64_t Wp, plane;  // padded row length and plane size: (H + 3) x (W + 2)
};

int64_t out_size(int64_t size, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  const int64_t span = dilation * (kernel - 1) + 1;
  const int64_t room = size + 2 * pad - span;
  return room < 0 ? (room - stride + 1) / stride + 1 : room / stride + 1;  // floor division
}

using onnx_custom_dcn::PlaneTaps;

#ifdef ONNX_CUSTOM_DCN_AVX2
bool has_avx2() {
  static const bool yes = [] {
    __builtin_cpu_init();
    const char* cap = std::getenv("ONNX_CUSTOM_NATIVE_ISA");
    const bool capped = cap != nullptr && std::strcmp(cap, "generic") == 0;
    return !capped && onnx_custom_dcn::cpu_has_avx2_fma();
  }();
  return yes;
}
#endif

template <typename T>
using Sampler = void (*)(const T*, int64_t, const int32_t*, const T*, const T*, int64_t, T*);

template <typename T>
Sampler<T> sampler() {
#ifdef ONNX_CUSTOM_DCN_AVX2
  if constexpr (std::is_same_v<T, float>) {
    if (has_avx2()) {
      const char* choice = std::getenv("ONNX_CUSTOM_NATIVE_SAMPLER");
      if (choice != nullptr && std::strcmp(choice, "gather") == 0) {
        return onnx_custom_dcn::sample_plane_row_gather;
      }
      return onnx_custom_dcn::sample_plane_row_pairs;
    }
  }
#endif
  return onnx_custom_dcn::sample_plane_row<T>;
}

// Samples of one im2col row (len positions) written into column strips of width S, `stride`
// apart; the last strip's columns past len are zeroed (the GEMM reads whole strips).
template <typename T>
void sample_row(Sampler<T> sample, const T* plane, int64_t Wp, const PlaneTaps<T>& t, int64_t at,
                int64_t len, int64_t S, int64_t stride, T* dst) {
  for (int64_t s0 = 0; s0 < len; s0 += S, dst += stride) {
    const int64_t n = std::min(S, len - s0);
    sample(plane, Wp, t.base.data() + at + s0, t.top.data() + 2 * (at + s0),
           t.bottom.data() + 2 * (at + s0), n, dst);
    if (n < S) std::fill(dst + n, dst + S, T(0));
  }
}

// The im2col columns of one tile (output positions p0 .. p0 + len) for every group: group gi's
// B matrix (rows = cin_g * K, one per (channel, tap); len columns) starts at gi * group_stride
// and is laid out in column strips of width S (S = gemm_nr for our GEMM's packed B; S = len for
// a plain row-major matrix).
template <typename T>
void im2col_tile(const Geometry& g, Sampler<T> sample, const T* padded, const T* off,
                 const T* mask, int64_t p0, int64_t len, int64_t S, PlaneTaps<T>& taps, T* cols) {
  const int64_t rows = g.cin_g * g.K, strips = (len + S - 1) / S;
  const int64_t strip_stride = rows * S, group_stride = strips * strip_stride;
  for (int64_t og = 0; og < g.offset_groups; ++og) {
    for (int64_t k = 0; k < g.K; ++k) {
      onnx_custom_dcn::build_plane_taps(g, off, mask, og, k, p0, len, taps, k * len);
    }
    for (int64_t c = og * g.cpog; c < (og + 1) * g.cpog; ++c) {
      const int64_t gi = c / g.cin_g, first_row = (c - gi * g.cin_g) * g.K;
      for (int64_t k = 0; k < g.K; ++k) {
        sample_row(sample, padded + c * g.plane, g.Wp, taps, k * len, len, S, strip_stride,
                   cols + gi * group_stride + (first_row + k) * S);
      }
    }
  }
}

// The gather path of deform_conv (fewer than 8 channels per offset group): zero-bordered NCHW
// planes, sampled per plane into packed GEMM strips; ORT's Gemm when the kernel chose it.
template <typename T>
void deform_conv_planes(Context& ctx, const Geometry& g, const T* input, const T* weight,
                        const T* offset, const T* mask, const T* bias, T* output,
                        const OrtGemm* ort_gemm) {
  // Uninitialized, then every element written once: the border zeros and the image rows (a
  // zero-filled allocation would write the whole buffer twice).
  std::unique_ptr<T[]> padded(new T[static_cast<size_t>(g.N * g.C * g.plane)]);
  ctx.parallel_for(static_cast<size_t>(g.N), [&](size_t n) {
    for (int64_t c = 0; c < g.C; ++c) {
      const T* src = input + (static_cast<int64_t>(n) * g.C + c) * g.H * g.W;
      T* plane = padded.get() + (static_cast<int64_t>(n) * g.C + c) * g.plane;
      std::fill(plane, plane + g.Wp, T(0));  // top border row
      for (int64_t y = 0; y < g.H; ++y) {
        T* row = plane + (y + 1) * g.Wp;
        row[0] = row[g.W + 1] = T(0);
        std::copy(src + y * g.W, src + (y + 1) * g.W, row + 1);
      }
      std::fill(plane + (g.H + 1) * g.Wp, plane + g.plane, T(0));  // bottom border + zero row
    }
  });
  const int64_t tiles = (g.P + kTile - 1) / kTile, rows = g.cin_g * g.K;
  const int64_t off_stride = 2 * g.offset_groups * g.K * g.P, mask_stride = off_stride / 2;
  const bool ours = ort_gemm == nullptr || !std::is_same_v<T, float> || rows == 0;
  // Our GEMM reads the columns as packed strips and the weights packed once per call.
  const int64_t S = ours ? gemm_nr<T>() : 0;
  const size_t packed_size = ours ? packed_a_size<T>(g.cout_g, rows) : 0;
  std::vector<T> packed_w(packed_size * static_cast<size_t>(g.groups));
  for (int64_t grp = 0; ours && grp < g.groups; ++grp) {
    pack_a<T>(weight + grp * g.cout_g * rows, rows, g.cout_g, rows, packed_w.data() + grp * packed_size);
  }
  const Sampler<T> sample = sampler<T>();
  ctx.parallel_for(static_cast<size_t>(g.N * tiles), [&](size_t item) {
    thread_local PlaneTaps<T> taps;
    thread_local std::vector<T> cols, staged;
    const int64_t n = static_cast<int64_t>(item) / tiles, p0 = (static_cast<int64_t>(item) % tiles) * kTile;
    const int64_t len = std::min(kTile, g.P - p0), width = ours ? S : len;
    const int64_t group_stride = (len + width - 1) / width * width * rows;
    taps.reserve(g.K * kTile);
    if (cols.size() < static_cast<size_t>(group_stride * g.groups)) cols.resize(group_stride * g.groups);
    im2col_tile(g, sample, padded.get() + n * g.C * g.plane, offset + n * off_stride,
                g.use_mask ? mask + n * mask_stride : nullptr, p0, len, width, taps, cols.data());
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      const T* b = cols.data() + grp * group_stride;
      T* out = output + (n * g.Cout + grp * g.cout_g) * g.P + p0;
      const T* bias_g = bias + grp * g.cout_g;
      if constexpr (std::is_same_v<T, float>) {
        if (!ours) {  // ORT's Gemm writes a contiguous block: stage, then copy into the rows
          if (staged.size() < static_cast<size_t>(g.cout_g * len)) staged.resize(g.cout_g * len);
          ort_gemm->run(ctx.raw(), weight + grp * g.cout_g * rows, b, bias_g, true, staged.data(),
                        g.cout_g, len, rows);
          for (int64_t co = 0; co < g.cout_g; ++co) {
            std::copy(staged.data() + co * len, staged.data() + (co + 1) * len, out + co * g.P);
          }
          continue;
        }
      }
      for (int64_t co = 0; co < g.cout_g; ++co) std::fill(out + co * g.P, out + co * g.P + len, bias_g[co]);
      gemm_packed<T>(g.cout_g, len, rows, packed_w.data() + grp * packed_size, b, out, g.P, true);
    }
  });
}

// Zero-bordered channels-last copies [H+2, W+2, C] of images [n0, n1) of the NCHW input into dst,
// one task per bordered row; every element written once (border zeros and interior).
template <typename T>
void bordered_channels_last(Context& ctx, const Geometry& g, const T* input, int64_t n0, int64_t n1,
                            T* dst) {
  const int64_t row = (g.W + 2) * g.C, rows = g.H + 2;
  // Pixels per transposed block: 16 output pixels x C channels stay in L1 while the C input rows
  // are read contiguously.
  constexpr int64_t kBlock = 16;
  ctx.parallel_for(static_cast<size_t>((n1 - n0) * rows), [&](size_t item) {
    const int64_t i = static_cast<int64_t>(item) / rows, y = static_cast<int64_t>(item) % rows;
    T* out = dst + (i * rows + y) * row;
    if (y == 0 || y == g.H + 1) {
      std::fill(out, out + row, T(0));
      return;
    }
    std::fill(out, out + g.C, T(0));
    std::fill(out + (g.W + 1) * g.C, out + row, T(0));
    const T* src = input + (n0 + i) * g.C * g.H * g.W + (y - 1) * g.W;
    for (int64_t x0 = 0; x0 < g.W; x0 += kBlock) {
      const int64_t x1 = std::min(g.W, x0 + kBlock);
      for (int64_t c = 0; c < g.C; ++c) {
        const T* s = src + c * g.H * g.W;
        for (int64_t x = x0; x < x1; ++x) out[(x + 1) * g.C + c] = s[x];
      }
    }
  });
}

// The channels-last path of deform_conv (at least 8 channels per offset group): the eager op's
// forward (onnx_custom/kernels/deform_conv.h), tile by tile. avx512: the float sampler and GEMM run the
// AVX-512 kernels (the caller checked the CPU); else the compiler's sampling loop and gemm().
template <typename T>
void deform_conv_channels_last(Context& ctx, const Geometry& g, const T* input, const T* weight,
                               const T* offset, const T* mask, const T* bias, T* output,
                               bool avx512) {
  constexpr int64_t kTile = onnx_custom_dcn::kChannelsLastTile;
  const int64_t image = (g.H + 2) * (g.W + 2) * g.C, rows = g.cin_g * g.K, CK = g.C * g.K;
  const int64_t tiles = (g.P + kTile - 1) / kTile;
  // Images pass by pass, each pass converting as many images as fit in ~512 KiB and then sampling
  // them while they are still in cache (converting all N first measured ~2x the sampler's time at
  // 64 channels, 56x56, N=4: each 0.8 MiB image had left L2 by the time it was sampled).
  const int64_t per_pass = std::max<int64_t>(1, (int64_t(512) << 10) / (image * int64_t(sizeof(T))));
  std::unique_ptr<T[]> images(new T[static_cast<size_t>(std::min(per_pass, g.N) * image)]);
  const int64_t off_stride = 2 * g.offset_groups * g.K * g.P, mask_stride = off_stride / 2;
  // The weight as [Cout, K * cin_g] ([tap][c] per output channel): the columns' row order.
  std::vector<T> wt(static_cast<size_t>(g.Cout * rows));
  for (int64_t co = 0; co < g.Cout; ++co) {
    for (int64_t c = 0; c < g.cin_g; ++c) {
      for (int64_t k = 0; k < g.K; ++k) wt[co * rows + k * g.cin_g + c] = weight[(co * g.cin_g + c) * g.K + k];
    }
  }
  std::vector<float> packed;
#ifdef ONNX_CUSTOM_DCN_AVX512
  if constexpr (std::is_same_v<T, float>) {
    if (avx512) {
      packed.resize(static_cast<size_t>(onnx_custom_dcn::packed_weight_size(g)));
      onnx_custom_dcn::pack_weight(g, wt.data(), packed.data());
    }
  }
#endif
  for (int64_t n0 = 0; n0 < g.N; n0 += per_pass) {
    const int64_t n1 = std::min(g.N, n0 + per_pass);
    bordered_channels_last(ctx, g, input, n0, n1, images.get());
    ctx.parallel_for(static_cast<size_t>((n1 - n0) * tiles), [&](size_t item) {
      thread_local onnx_custom_dcn::ForwardTaps<T> taps;
      thread_local std::vector<T> cols;
      const int64_t i = static_cast<int64_t>(item) / tiles, n = n0 + i;
      const int64_t p0 = (static_cast<int64_t>(item) % tiles) * kTile, len = std::min(kTile, g.P - p0);
      taps.reserve(g.K * kTile);
      if (cols.size() < static_cast<size_t>(kTile * CK)) cols.resize(static_cast<size_t>(kTile * CK));
      onnx_custom_dcn::im2col_cl_tile(g, images.get() + i * image, offset + n * off_stride,
                                      g.use_mask ? mask + n * mask_stride : nullptr, p0, len, taps,
                                      cols.data(), avx512);
      T* out = output + n * g.Cout * g.P + p0;
#ifdef ONNX_CUSTOM_DCN_AVX512
      if constexpr (std::is_same_v<T, float>) {
        if (avx512) {
          onnx_custom_dcn::gemm_tile(g, cols.data(), len, packed.data(), bias, out);
          return;
        }
      }
#endif
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        T* out_g = out + grp * g.cout_g * g.P;
        for (int64_t co = 0; co < g.cout_g; ++co) {
          std::fill(out_g + co * g.P, out_g + co * g.P + len, bias[grp * g.cout_g + co]);
        }
        // B[k, t] = cols[t * CK + grp * rows + k]: the columns as written (gemm() packs them).
        gemm(g.cout_g, len, rows, wt.data() + grp * g.cout_g * rows, rows, 1,
             cols.data() + grp * rows, 1, CK, out_g, g.P, /*accumulate=*/true);
      }
    });
  }
}

// output[N, Cout, Ho, Wo] for T in {float, double} (16-bit types are widened by the caller).
template <typename T>
void deform_conv(Context& ctx, const Geometry& g, const T* input, const T* weight, const T* offset,
                 const T* mask, const T* bias, T* output, const OrtGemm* ort_gemm, bool avx512) {
  if (g.cpog >= onnx_custom_dcn::kChannelsLastMinChannels) {
    deform_conv_channels_last(ctx, g, input, weight, offset, mask, bias, output, avx512);
  } else {
    deform_conv_planes(ctx, g, input, weight, offset, mask, bias, output, ort_gemm);
  }
}

template <typename T>
std::vector<float> widen(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.size));
  const T* p = t.as<T>();
  for (int64_t i = 0; i < t.size; ++i) out[i] = load(p[i]);
  return out;
}

// Whether the float channels-last forward runs the AVX-512 kernels: where the CPU has AVX-512F,
// unless ONNX_CUSTOM_NATIVE_ISA caps the library below it or ONNX_CUSTOM_NATIVE_DCN=portable (read
// at kernel creation, like ONNX_CUSTOM_NATIVE_GEMM: tests run both paths in one process).
bool use_avx512() {
#ifdef ONNX_CUSTOM_DCN_AVX512
  const char* choice = std::getenv("ONNX_CUSTOM_NATIVE_DCN");
  if (choice != nullptr && std::strcmp(choice, "portable") == 0) return false;
  return onnx_custom_dcn::cpu_has_avx512f() && std::strcmp(gemm_isa(), "avx512") == 0;
#else
  return false;
#endif
}

Params read_params(int64_t (*get)(const void*, const char*, int64_t), const void* src) {
  Params p;
  p.sh = get(src, "stride_h", 1);
  p.sw = get(src, "stride_w", 1);
  p.ph = get(src, "pad_h", 0);
  p.pw = get(src, "pad_w", 0);
  p.dh = get(src, "dilation_h", 1);
  p.dw = get(src, "dilation_w", 1);
  p.groups = get(src, "groups", 1);
  p.offset_groups = get(src, "offset_groups", 1);
  p.use_mask = get(src, "use_mask", 0) != 0;
  const struct { const char* name; int64_t value; int64_t lowest; } checks[] = {
      {"stride_h", p.sh, 1}, {"stride_w", p.sw, 1}, {"dilation_h", p.dh, 1},
      {"dilation_w", p.dw, 1}, {"groups", p.groups, 1}, {"offset_groups", p.offset_groups, 1},
      {"pad_h", p.ph, 0}, {"pad_w", p.pw, 0}};
  for (const auto& c : checks) {
    if (c.value < c.lowest || c.value > kAttrLimit) {
      fail("attribute %s must be in [%lld, 2^30]; received %lld", c.name,
           static_cast<long long>(c.lowest), static_cast<long long>(c.value));
    }
  }
  return p;
}

class DeformConv2d final : public Kernel {
 public:
  explicit DeformConv2d(const Attributes& attrs)
      : p_(read_params([](const void* a, const char* name, int64_t fallback) {
                         return static_cast<const Attributes*>(a)->int_or(name, fallback);
                       }, &attrs)) {
    // Our GEMM by default: on par with ORT's Gemm through InvokeOp here (benchmarks/native_ops.py
    // --only dcn), and it reads the im2col columns in place (packed as it samples them, no staging
    // copy), for every dtype, without invoking ORT ops from inside thread-pool tasks.
    // (ORT's Gemm serves the gather path only: the channels-last path's columns are [t][tap][c],
    // which its row-major Gemm cannot read in place.)
    ort_gemm_ = make_ort_gemm(choose_gemm(GemmBackend::own), attrs.raw(), /*trans_b=*/false);
    avx512_ = use_avx512();
  }

  void compute(Context& ctx) override {
    const Tensor input = ctx.input(0), weight = ctx.input(1), offset = ctx.input(2);
    const Tensor mask = ctx.input(3), bias = ctx.input(4);
    const Geometry g = validate(input, weight, offset, mask, bias);
    const Tensor out = ctx.output(0, {g.N, g.Cout, g.Ho, g.Wo});
    if (out.size == 0) return;
    const std::vector<float> no_bias(static_cast<size_t>(g.Cout), 0.0f);
    dispatch_float(input.elem, "input", kFloats, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        const std::vector<T> zeros(static_cast<size_t>(g.Cout), T(0));
        deform_conv<T>(ctx, g, input.as<T>(), weight.as<T>(), offset.as<T>(),
                       g.use_mask ? mask.as<T>() : nullptr, bias.present ? bias.as<T>() : zeros.data(),
                       out.mut<T>(), ort_gemm_.get(), avx512_);
      } else {  // float16 / bfloat16: widen, compute in float32, round once
        const std::vector<float> in = widen<T>(input), w = widen<T>(weight), off = widen<T>(offset);
        const std::vector<float> m = g.use_mask ? widen<T>(mask) : std::vector<float>();
        const std::vector<float> b = bias.present ? widen<T>(bias) : no_bias;
        std::vector<float> result(static_cast<size_t>(out.size));
        deform_conv<float>(ctx, g, in.data(), w.data(), off.data(), m.empty() ? nullptr : m.data(),
                           b.data(), result.data(), ort_gemm_.get(), avx512_);
        T* dst = out.mut<T>();
        for (int64_t i = 0; i < out.size; ++i) dst[i] = store<T>(result[i]);
      }
    });
  }

  static void infer(const InferContext& ctx) {
    const TypeShape x = ctx.input(0), w = ctx.input(1), off = ctx.input(2);
    if (!x.present) fail("the element type of input is unknown at graph time");
    const Params p = read_params([](const void* c, const char* name, int64_t fallback) {
                                   int64_t v = fallback;
                                   static_cast<const InferContext*>(c)->attr(name, &v);
                                   return v;
                                 }, &ctx);
    std::vector<Dim> out(4, Dim::unknown());  // the rank is always 4
    if (x.has_shape && w.has_shape && x.dims.size() == 4 && w.dims.size() == 4) {
      const bool off4 = off.has_shape && off.dims.size() == 4;
      const auto spatial = [&](size_t d, int64_t stride, int64_t pad, int64_t dil) {
        if (x.dims[d].is_known() && w.dims[d].is_known()) {
          const int64_t n = out_size(x.dims[d].value, w.dims[d].value, stride, pad, dil);
          if (n <= 0) fail("input is too small for the kernel: output size %lld", static_cast<long long>(n));
          return Dim::known(n);
        }
        return off4 ? off.dims[d] : Dim::unknown();  // offset's spatial dims equal the output's
      };
      out = {x.dims[0], w.dims[0], spatial(2, p.sh, p.ph, p.dh), spatial(3, p.sw, p.pw, p.dw)};
    }
    ctx.set_output(0, x.elem, out);
  }

 private:
  Geometry validate(const Tensor& input, const Tensor& weight, const Tensor& offset,
                    const Tensor& mask, const Tensor& bias) const {
    require_dtype("input", input, kFloats);
    require_same_dtype("weight", weight, "input", input);
    require_same_dtype("offset", offset, "input", input);
    if (p_.use_mask) {
      if (!mask.present) fail("use_mask=1 but the mask input is absent; fix: pass the mask or set use_mask=0");
      require_same_dtype("mask", mask, "input", input);
    }
    if (bias.present) require_same_dtype("bias", bias, "input", input);
    require_rank("input", input, 4, "(N, C, H, W)");
    require_rank("weight", weight, 4, "(Cout, C / groups, kh, kw)");
    require_rank("offset", offset, 4, "(N, 2 * offset_groups * kh * kw, Ho, Wo)");
    if (p_.use_mask) require_rank("mask", mask, 4, "(N, offset_groups * kh * kw, Ho, Wo)");
    if (bias.present) require_rank("bias", bias, 1, "(Cout,)");
    Geometry g;
    g.sh = p_.sh; g.sw = p_.sw; g.ph = p_.ph; g.pw = p_.pw; g.dh = p_.dh; g.dw = p_.dw;
    g.groups = p_.groups; g.offset_groups = p_.offset_groups; g.use_mask = p_.use_mask;
    g.N = input.dim(0); g.C = input.dim(1); g.H = input.dim(2); g.W = input.dim(3);
    g.Cout = weight.dim(0); g.kh = weight.dim(2); g.kw = weight.dim(3); g.K = g.kh * g.kw;
    const std::string in_s = shape_str(input.shape), w_s = shape_str(weight.shape);
    if (g.C != weight.dim(1) * p_.groups) {
      fail("input channels %lld (input %s) must equal weight.shape[1] * groups = %lld * %lld "
           "(weight %s)", static_cast<long long>(g.C), in_s.c_str(),
           static_cast<long long>(weight.dim(1)), static_cast<long long>(p_.groups), w_s.c_str());
    }
    if (g.Cout % p_.groups != 0) {
      fail("out channels %lld (weight %s) are not divisible by groups=%lld",
           static_cast<long long>(g.Cout), w_s.c_str(), static_cast<long long>(p_.groups));
    }
    if (g.C % p_.offset_groups != 0) {
      fail("input channels %lld are not divisible by offset_groups=%lld",
           static_cast<long long>(g.C), static_cast<long long>(p_.offset_groups));
    }
    if (bias.present && bias.dim(0) != g.Cout) {
      fail("bias %s does not match out channels %lld", shape_str(bias.shape).c_str(),
           static_cast<long long>(g.Cout));
    }
    g.Ho = out_size(g.H, g.kh, p_.sh, p_.ph, p_.dh);
    g.Wo = out_size(g.W, g.kw, p_.sw, p_.pw, p_.dw);
    if (g.Ho <= 0 || g.Wo <= 0) {
      fail("input %s is too small for kernel (%lld, %lld), padding (%lld, %lld), dilation "
           "(%lld, %lld): output would be (%lld, %lld)", in_s.c_str(),
           static_cast<long long>(g.kh), static_cast<long long>(g.kw),
           static_cast<long long>(p_.ph), static_cast<long long>(p_.pw),
           static_cast<long long>(p_.dh), static_cast<long long>(p_.dw),
           static_cast<long long>(g.Ho), static_cast<long long>(g.Wo));
    }
    const Shape want_off = {g.N, 2 * p_.offset_groups * g.K, g.Ho, g.Wo};
    if (offset.shape != want_off) {
      fail("offset must have shape (N, 2*offset_groups*kh*kw, Ho, Wo) = %s; received %s (input "
           "%s, weight %s)", shape_str(want_off).c_str(), shape_str(offset.shape).c_str(),
           in_s.c_str(), w_s.c_str());
    }
    if (p_.use_mask) {
      const Shape want_mask = {g.N, p_.offset_groups * g.K, g.Ho, g.Wo};
      if (mask.shape != want_mask) {
        fail("mask must have shape (N, offset_groups*kh*kw, Ho, Wo) = %s; received %s (offset %s)",
             shape_str(want_mask).c_str(), shape_str(mask.shape).c_str(),
             shape_str(offset.shape).c_str());
      }
    }
    g.P = g.Ho * g.Wo;
    g.cin_g = g.C / p_.groups;
    g.cout_g = g.Cout / p_.groups;
    g.cpog = g.C / p_.offset_groups;
    g.Wp = g.W + 2;
    g.plane = (g.H + 3) * g.Wp;
    if (g.plane >= (int64_t(1) << 31)) {
      fail("(H + 3) * (W + 2) must be below 2^31 (32-bit sample indices); received input %s",
           in_s.c_str());
    }
    return g;
  }

  Params p_;
  std::unique_ptr<OrtGemm> ort_gemm_;
  bool avx512_ = false;
};

}  // namespace

void add_deform_conv_ops(std::vector<OpDef>& ops) {
  ops.push_back({"onnx_custom", "DeformConv2d",
                 {OC_IO_REQUIRED, OC_IO_REQUIRED, OC_IO_REQUIRED, OC_IO_OPTIONAL, OC_IO_OPTIONAL},
                 {OC_IO_REQUIRED}, create_kernel<DeformConv2d>, DeformConv2d::infer});
}

}  // namespace oc
