// onnx_custom::MultiScaleDeformableAttn (and mmdeploy::MMCVMultiScaleDeformableAttention): the native
// kernel of onnx_custom::multi_scale_deformable_attn, written against the user kernel API
// (onnx_custom/kernel.h) exactly as a user writes their own op: the op spec (onnx_custom/ops/msda.py,
// `native=NativeKernel("msda.cpp", "onnx_custom_msda::multi_scale_deformable_attn")`) declares it, and
// its ONNX Runtime registration (msda_generated.cpp) is generated from that spec by
// onnx_custom.spec.native_codegen, the code generator of `onnx-custom build-library --spec`.
//
// Semantics of onnx_custom/ops/msda.py: mmcv's inputs (value, spatial_shapes, level_start_index,
// sampling_locations, attention_weights), INT attribute im2col_step (a CUDA batching hint: any
// positive value, no effect on the result); bilinear samples as grid_sample(align_corners=False,
// padding_mode="zeros") on grid 2 * loc - 1; a non-finite location contributes 0.
//
// Everything here is a template or inline: the generated binding includes this file, and the
// shipped build (Makefile, CMake, the one-line command) also compiles it on its own.
#include <onnx_custom/kernel.h>
#include <onnx_custom/kernels/msda.h>  // the bilinear sample, shared with the eager op

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

namespace onnx_custom_msda {

using onnx_custom::Tensor;

// Sizes of one call; H, W, start per level.
struct Geometry {
  int64_t bs = 0, K = 0, M = 0, D = 0, Q = 0, L = 0, P = 0;
  std::vector<int64_t> H, W, start;
};

inline std::string shape_text(const onnx_custom::Shape& s) { return onnx_custom::to_string(s); }

// The level tensors' values against num_keys: 0 <= H, W < 2^31, sum(H*W) == num_keys and
// level_start_index == the exclusive cumulative sum of H*W. Fills g.H, g.W, g.start.
inline void check_layout(Geometry& g, const int64_t* shapes, const int64_t* starts) {
  int64_t total = 0;
  std::string expected_starts, given_starts;
  bool starts_ok = true;
  for (int64_t l = 0; l < g.L; ++l) {
    const int64_t h = shapes[2 * l], w = shapes[2 * l + 1];
    if (h < 0 || w < 0 || h > (int64_t(1) << 31) || w > (int64_t(1) << 31)) {
      onnx_custom::fail("spatial_shapes holds an invalid size (" + std::to_string(h) + ", " + std::to_string(w) +
                        ") at level " + std::to_string(l) + "; expected 0 <= H, W < 2^31");
    }
    starts_ok = starts_ok && starts[l] == total;
    expected_starts += (l ? ", " : "") + std::to_string(total);
    given_starts += (l ? ", " : "") + std::to_string(starts[l]);
    g.H.push_back(h);
    g.W.push_back(w);
    g.start.push_back(total);
    total += h * w;
  }
  if (total != g.K) {
    onnx_custom::fail("spatial_shapes cover sum(H*W) = " + std::to_string(total) + " keys but value has num_keys = " +
                      std::to_string(g.K) + "; fix: value must be the levels' H*W features concatenated");
  }
  if (!starts_ok) {
    onnx_custom::fail("level_start_index [" + given_starts + "] does not match spatial_shapes: expected [" +
                      expected_starts + "] (the exclusive cumulative sum of H*W)");
  }
}

// Ranks, the dims the tensors share and the level layout; the typed checks of the eager op
// (validate_msda, check_level_layout), as messages of an ORT error status.
template <typename T>
Geometry validate(const Tensor<T>& value, const Tensor<int64_t>& shapes, const Tensor<int64_t>& starts,
                  const Tensor<T>& loc, const Tensor<T>& attn, int64_t im2col_step) {
  if (im2col_step <= 0) {
    onnx_custom::fail("im2col_step must be positive; received " + std::to_string(im2col_step) + "; fix: 64 (mmcv's default)");
  }
  const struct {
    const char* name;
    int64_t rank, actual;
    const char* layout;
  } ranks[] = {{"value", 4, value.rank(), "(bs, num_keys, num_heads, head_dim)"},
               {"spatial_shapes", 2, shapes.rank(), "(num_levels, 2)"},
               {"level_start_index", 1, starts.rank(), "(num_levels,)"},
               {"sampling_locations", 6, loc.rank(), "(bs, num_queries, num_heads, num_levels, num_points, 2)"},
               {"attention_weights", 5, attn.rank(), "(bs, num_queries, num_heads, num_levels, num_points)"}};
  for (const auto& r : ranks) {
    if (r.actual != r.rank) {
      onnx_custom::fail(std::string(r.name) + " must be " + std::to_string(r.rank) + "-D " + r.layout + "; received rank " +
                        std::to_string(r.actual));
    }
  }
  Geometry g;
  g.bs = value.dim(0), g.K = value.dim(1), g.M = value.dim(2), g.D = value.dim(3);
  g.Q = loc.dim(1), g.L = shapes.dim(0), g.P = loc.dim(4);
  if (shapes.dim(1) != 2) onnx_custom::fail("spatial_shapes must be (num_levels, 2) holding (H, W); received " + shape_text(shapes.shape()));
  const onnx_custom::Shape want_loc = {g.bs, g.Q, g.M, g.L, g.P, 2};
  if (loc.shape() != want_loc) {
    onnx_custom::fail("sampling_locations must be (bs, num_queries, num_heads, num_levels, num_points, 2) = " +
                      shape_text(want_loc) + " (bs, num_heads from value " + shape_text(value.shape()) +
                      ", num_levels from spatial_shapes " + shape_text(shapes.shape()) + "); received " + shape_text(loc.shape()));
  }
  const onnx_custom::Shape want_attn(want_loc.begin(), want_loc.end() - 1);
  if (attn.shape() != want_attn) {
    onnx_custom::fail("attention_weights must have shape " + shape_text(want_attn) + " (sampling_locations " +
                      shape_text(loc.shape()) + "); received " + shape_text(attn.shape()));
  }
  if (starts.dim(0) != g.L) {
    onnx_custom::fail("level_start_index must have shape (" + std::to_string(g.L) + ",) like spatial_shapes " +
                      shape_text(shapes.shape()) + "; received " + shape_text(starts.shape()));
  }
  check_layout(g, shapes.data(), starts.data());
  return g;
}

// Output rows [begin, end) of (bs * Q): out[bq, h*D:(h+1)*D] for every head. V: value's compute-type
// storage (float for the 16-bit formats, converted once up front); T: the storage type of
// locations, weights and output. Each (query, head) first lists its taps (the shared header's
// list_taps: every in-level corner with its attention x bilinear weight), then sums them with the
// accumulators in registers (sum_taps) and writes its output row once.
template <typename T, typename V>
inline void forward_rows_impl(const Geometry& g, const V* value, const T* loc, const T* attn, T* out, int64_t begin,
                              int64_t end) {
  using C = onnx_custom::acc_t<T>;
  const int64_t key_stride = g.M * g.D, samples = g.L * g.P;
  std::vector<onnx_custom_msda_math::Tap<C>> taps(static_cast<size_t>(4 * samples));
  std::vector<C> row(std::is_same_v<T, C> ? 0 : static_cast<size_t>(g.D));
  for (int64_t bq = begin; bq < end; ++bq) {
    const V* vb = value + (bq / g.Q) * g.K * key_stride;
    for (int64_t h = 0; h < g.M; ++h) {
      const int64_t s0 = (bq * g.M + h) * samples;
      const int64_t n = onnx_custom_msda_math::list_taps<C, T>(loc + 2 * s0, attn + s0, g.L, g.P, g.H.data(),
                                                              g.W.data(), g.start.data(), taps.data());
      T* o = out + bq * key_stride + h * g.D;
      if constexpr (std::is_same_v<T, C>) {
        onnx_custom_msda_math::sum_taps(taps.data(), n, vb + h * g.D, key_stride, g.D, o);
      } else {
        onnx_custom_msda_math::sum_taps(taps.data(), n, vb + h * g.D, key_stride, g.D, row.data());
        for (int64_t d = 0; d < g.D; ++d) o[d] = static_cast<T>(row[static_cast<size_t>(d)]);
      }
    }
  }
}

#if ONNX_CUSTOM_MSDA_X86
// The float32 rows with AVX2 + FMA, picked at run time where the CPU has them.
__attribute__((target("avx2,fma"))) inline void forward_rows_avx2(const Geometry& g, const float* value,
                                                                  const float* loc, const float* attn, float* out,
                                                                  int64_t begin, int64_t end) {
  const int64_t key_stride = g.M * g.D, samples = g.L * g.P;
  std::vector<onnx_custom_msda_math::Tap<float>> taps(static_cast<size_t>(4 * samples));
  for (int64_t bq = begin; bq < end; ++bq) {
    const float* vb = value + (bq / g.Q) * g.K * key_stride;
    for (int64_t h = 0; h < g.M; ++h) {
      const int64_t s0 = (bq * g.M + h) * samples;
      const int64_t n = onnx_custom_msda_math::list_taps<float, float>(loc + 2 * s0, attn + s0, g.L, g.P, g.H.data(),
                                                                      g.W.data(), g.start.data(), taps.data());
      onnx_custom_msda_math::sum_taps_avx2(taps.data(), n, vb + h * g.D, key_stride, g.D,
                                           out + bq * key_stride + h * g.D);
    }
  }
}
#endif

template <typename T, typename V>
void forward_rows(const Geometry& g, const V* value, const T* loc, const T* attn, T* out, int64_t begin, int64_t end) {
#if ONNX_CUSTOM_MSDA_X86
  if constexpr (std::is_same_v<T, float> && std::is_same_v<V, float>) {
    if (onnx_custom_msda_math::has_avx2_fma()) {
      forward_rows_avx2(g, value, loc, attn, out, begin, end);
      return;
    }
  }
#endif
  forward_rows_impl<T, V>(g, value, loc, attn, out, begin, end);
}

constexpr int64_t kRowsPerTask = 16;

// The kernel: the spec's inputs, output and attribute in order (onnx_custom/kernel.h). T is the one
// dtype of value, sampling_locations and attention_weights (float, double, float16, bfloat16); the
// generated binding checks it and allocates `output` from the spec's shape rule
// [value.0, sampling_locations.1, value.2 * value.3].
template <typename T>
void multi_scale_deformable_attn(const Tensor<T>& value, const Tensor<int64_t>& spatial_shapes,
                                 const Tensor<int64_t>& level_start_index, const Tensor<T>& sampling_locations,
                                 const Tensor<T>& attention_weights, Tensor<T>& output, int64_t im2col_step) {
  const Geometry g = validate(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, im2col_step);
  if (output.size() == 0) return;
  using C = onnx_custom::acc_t<T>;
  std::vector<C> widened;  // the 16-bit formats: value converted once, not per corner read
  const C* v;
  if constexpr (std::is_same_v<T, C>) {
    v = value.data();
  } else {
    widened.resize(static_cast<size_t>(value.size()));
    const T* src = value.data();
    onnx_custom::parallel_for(value.size(), int64_t(1) << 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) widened[static_cast<size_t>(i)] = static_cast<C>(src[i]);
    });
    v = widened.data();
  }
  const T* loc = sampling_locations.data();
  const T* attn = attention_weights.data();
  T* out = output.data();
  onnx_custom::parallel_for(g.bs * g.Q, kRowsPerTask, [&](int64_t begin, int64_t end) {
    forward_rows<T, C>(g, v, loc, attn, out, begin, end);
  });
}

}  // namespace onnx_custom_msda
