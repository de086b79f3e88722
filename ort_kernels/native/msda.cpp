// onnx_custom::MultiScaleDeformableAttn and mmdeploy::MMCVMultiScaleDeformableAttention: multi-scale
// deformable attention with mmcv's signature, inputs (value, spatial_shapes, level_start_index,
// sampling_locations, attention_weights), INT attribute im2col_step (a CUDA batching hint: any
// positive value, no effect on the result). Semantics of onnx_custom/ops/msda.py: bilinear
// samples as grid_sample(align_corners=False, padding_mode="zeros") on grid 2 * loc - 1; a
// non-finite location contributes 0.
//
// The math is two pure functions on raw pointers (msda::check_layout, msda::forward_rows) with
// no ORT type in their signatures; the Kernel class below is only glue (inputs, validation,
// output, thread pool), so the math can move onto another kernel API unchanged.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "numeric.h"

namespace oc {
namespace msda {

// Sizes of one call; H, W, start per level.
struct Geometry {
  int64_t bs, K, M, D, Q, L, P;
  std::vector<int64_t> H, W, start;
};

// Checks the level tensors' values against num_keys (sum of H*W, exclusive cumulative starts);
// returns an empty string when they agree, else the problem.
inline std::string check_layout(Geometry* g, const int64_t* shapes, const int64_t* starts) {
  int64_t total = 0;
  std::string expected_starts, given_starts;
  bool starts_ok = true;
  for (int64_t l = 0; l < g->L; ++l) {
    const int64_t h = shapes[2 * l], w = shapes[2 * l + 1];
    if (h < 0 || w < 0 || h > (int64_t(1) << 31) || w > (int64_t(1) << 31)) {
      return "spatial_shapes holds an invalid size (" + std::to_string(h) + ", " + std::to_string(w) +
             ") at level " + std::to_string(l) + "; expected 0 <= H, W < 2^31";
    }
    starts_ok = starts_ok && starts[l] == total;
    expected_starts += (l ? ", " : "") + std::to_string(total);
    given_starts += (l ? ", " : "") + std::to_string(starts[l]);
    g->H.push_back(h);
    g->W.push_back(w);
    g->start.push_back(total);
    total += h * w;
  }
  if (total != g->K) {
    return "spatial_shapes cover sum(H*W) = " + std::to_string(total) + " keys but value has num_keys = " +
           std::to_string(g->K) + "; fix: value must be the levels' H*W features concatenated";
  }
  if (!starts_ok) {
    return "level_start_index [" + given_starts + "] does not match spatial_shapes: expected [" +
           expected_starts + "] (the exclusive cumulative sum of H*W)";
  }
  return std::string();
}

// Output rows [begin, end) of (bs * Q): out[bq, h*D:(h+1)*D] for every head. V: the value's
// compute-type storage (float for the 16-bit formats, converted up front); T: the storage type of
// locations, weights and output.
template <typename T, typename V>
void forward_rows(const Geometry& g, const V* value, const T* loc, const T* attn, T* out,
                  int64_t begin, int64_t end) {
  using C = Compute<T>;
  const int64_t key_stride = g.M * g.D;
  std::vector<C> acc(static_cast<size_t>(g.D));
  for (int64_t bq = begin; bq < end; ++bq) {
    const V* vb = value + (bq / g.Q) * g.K * key_stride;
    for (int64_t h = 0; h < g.M; ++h) {
      std::fill(acc.begin(), acc.end(), C(0));
      C* __restrict a_ = acc.data();
      const V* vh = vb + h * g.D;
      const int64_t sample0 = (bq * g.M + h) * g.L * g.P;
      for (int64_t l = 0; l < g.L; ++l) {
        const int64_t H = g.H[l], W = g.W[l];
        for (int64_t p = 0; p < g.P; ++p) {
          const int64_t s = sample0 + l * g.P + p;
          const C x = static_cast<C>(load(loc[2 * s])) * static_cast<C>(W) - C(0.5);
          const C y = static_cast<C>(load(loc[2 * s + 1])) * static_cast<C>(H) - C(0.5);
          // Outside [-1, W] x [-1, H] (or NaN) every corner is outside: nothing to add, and
          // floor() of a huge or NaN coordinate never reaches the integer cast.
          if (!(x >= C(-1) && x <= static_cast<C>(W) && y >= C(-1) && y <= static_cast<C>(H))) continue;
          const int64_t x0 = static_cast<int64_t>(std::floor(x)), y0 = static_cast<int64_t>(std::floor(y));
          const C lx = x - static_cast<C>(x0), ly = y - static_cast<C>(y0);
          const C a = static_cast<C>(load(attn[s]));
          const C w[4] = {(1 - ly) * (1 - lx), (1 - ly) * lx, ly * (1 - lx), ly * lx};
          for (int corner = 0; corner < 4; ++corner) {
            const int64_t cy = y0 + (corner >> 1), cx = x0 + (corner & 1);
            if (cy < 0 || cy >= H || cx < 0 || cx >= W) continue;
            const V* __restrict v = vh + (g.start[l] + cy * W + cx) * key_stride;
            const C aw = a * w[corner];
            for (int64_t d = 0; d < g.D; ++d) a_[d] += aw * static_cast<C>(v[d]);
          }
        }
      }
      T* o = out + bq * key_stride + h * g.D;
      for (int64_t d = 0; d < g.D; ++d) o[d] = store<T>(a_[d]);
    }
  }
}

}  // namespace msda

namespace {

const std::vector<int> kFloats = {OC_ELEM_FLOAT, OC_ELEM_DOUBLE, OC_ELEM_FLOAT16, OC_ELEM_BFLOAT16};
const std::vector<int> kInt64 = {OC_ELEM_INT64};
constexpr int64_t kRowsPerTask = 16;

class MultiScaleDeformableAttn final : public Kernel {
 public:
  explicit MultiScaleDeformableAttn(const Attributes& attrs) {
    const int64_t step = attrs.int_or("im2col_step", 64);
    if (step <= 0) fail("im2col_step must be positive; received %lld; fix: 64 (mmcv's default)", static_cast<long long>(step));
  }

  void compute(Context& ctx) override {
    const Tensor value = ctx.input(0), shapes = ctx.input(1), starts = ctx.input(2);
    const Tensor loc = ctx.input(3), attn = ctx.input(4);
    msda::Geometry g = validate(value, shapes, starts, loc, attn);
    const Tensor out = ctx.output(0, {g.bs, g.Q, g.M * g.D});
    if (out.size == 0) return;
    dispatch_float(value.elem, "value", kFloats, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = Compute<T>;
      std::vector<C> widened;  // the 16-bit formats: value converted once, not per corner read
      const C* v;
      if constexpr (std::is_same_v<T, C>) {
        v = value.as<T>();
      } else {
        widened.resize(static_cast<size_t>(value.size));
        const T* src = value.as<T>();
        for (int64_t i = 0; i < value.size; ++i) widened[i] = load(src[i]);
        v = widened.data();
      }
      const int64_t rows = g.bs * g.Q, tasks = (rows + kRowsPerTask - 1) / kRowsPerTask;
      ctx.parallel_for(static_cast<size_t>(tasks), [&](size_t t) {
        const int64_t begin = static_cast<int64_t>(t) * kRowsPerTask;
        msda::forward_rows<T, C>(g, v, loc.as<T>(), attn.as<T>(), out.mut<T>(), begin,
                                 std::min(rows, begin + kRowsPerTask));
      });
    });
  }

  static void infer(const InferContext& ctx) {
    const TypeShape value = ctx.input(0), loc = ctx.input(3);
    if (!value.present) fail("the element type of input value is unknown at graph time");
    std::vector<Dim> dims = {Dim::unknown(), Dim::unknown(), Dim::unknown()};
    if (value.has_shape && value.dims.size() == 4) {
      dims[0] = value.dims[0];
      if (value.dims[2].is_known() && value.dims[3].is_known()) {
        dims[2] = Dim::known(value.dims[2].value * value.dims[3].value);
      }
    }
    if (loc.present && loc.has_shape && loc.dims.size() == 6) dims[1] = loc.dims[1];
    ctx.set_output(0, value.elem, dims);
  }

 private:
  static msda::Geometry validate(const Tensor& value, const Tensor& shapes, const Tensor& starts,
                                 const Tensor& loc, const Tensor& attn) {
    require_dtype("value", value, kFloats);
    require_same_dtype("sampling_locations", loc, "value", value);
    require_same_dtype("attention_weights", attn, "value", value);
    require_dtype("spatial_shapes", shapes, kInt64);
    require_dtype("level_start_index", starts, kInt64);
    require_rank("value", value, 4, "(bs, num_keys, num_heads, head_dim)");
    require_rank("spatial_shapes", shapes, 2, "(num_levels, 2)");
    require_rank("level_start_index", starts, 1, "(num_levels,)");
    require_rank("sampling_locations", loc, 6, "(bs, num_queries, num_heads, num_levels, num_points, 2)");
    require_rank("attention_weights", attn, 5, "(bs, num_queries, num_heads, num_levels, num_points)");
    msda::Geometry g;
    g.bs = value.dim(0); g.K = value.dim(1); g.M = value.dim(2); g.D = value.dim(3);
    g.Q = loc.dim(1); g.L = shapes.dim(0); g.P = loc.dim(4);
    if (shapes.dim(1) != 2) fail("spatial_shapes must be (num_levels, 2) holding (H, W); received %s", shape_str(shapes.shape).c_str());
    const Shape want_loc = {g.bs, g.Q, g.M, g.L, g.P, 2};
    if (loc.shape != want_loc) {
      fail("sampling_locations must be (bs, num_queries, num_heads, num_levels, num_points, 2) = %s "
           "(bs, num_heads from value %s, num_levels from spatial_shapes %s); received %s",
           shape_str(want_loc).c_str(), shape_str(value.shape).c_str(), shape_str(shapes.shape).c_str(),
           shape_str(loc.shape).c_str());
    }
    const Shape want_attn(want_loc.begin(), want_loc.end() - 1);
    if (attn.shape != want_attn) {
      fail("attention_weights must have shape %s (sampling_locations %s); received %s",
           shape_str(want_attn).c_str(), shape_str(loc.shape).c_str(), shape_str(attn.shape).c_str());
    }
    if (starts.dim(0) != g.L) {
      fail("level_start_index must have shape (%lld,) like spatial_shapes %s; received %s",
           static_cast<long long>(g.L), shape_str(shapes.shape).c_str(), shape_str(starts.shape).c_str());
    }
    const std::string problem = msda::check_layout(&g, shapes.as<int64_t>(), starts.as<int64_t>());
    if (!problem.empty()) fail("%s", problem.c_str());
    return g;
  }
};

}  // namespace

void add_msda_ops(std::vector<OpDef>& ops) {
  const std::vector<int> inputs(5, OC_IO_REQUIRED);
  ops.push_back({"onnx_custom", "MultiScaleDeformableAttn", inputs, {OC_IO_REQUIRED},
                 create_kernel<MultiScaleDeformableAttn>, MultiScaleDeformableAttn::infer});
  ops.push_back({"mmdeploy", "MMCVMultiScaleDeformableAttention", inputs, {OC_IO_REQUIRED},
                 create_kernel<MultiScaleDeformableAttn>, MultiScaleDeformableAttn::infer});
}

}  // namespace oc
