// onnx_custom::MultiOut3: (x * scale, tile(x, repeats), x.sum(-1)), attributes repeats (INTS) and
// scale (FLOAT), both required; same semantics as ort_kernels/multi_out3.py.
#include <algorithm>

#include "numeric.h"

namespace oc {
namespace {

const std::vector<int> kFloats = {OC_ELEM_FLOAT, OC_ELEM_DOUBLE, OC_ELEM_FLOAT16, OC_ELEM_BFLOAT16};

class MultiOut3 final : public Kernel {
 public:
  explicit MultiOut3(const Attributes& attrs)
      : repeats_(attrs.ints("repeats")), scale_(attrs.float_required("scale")) {
    for (int64_t r : repeats_) {
      if (r < 0) fail("repeats must be non-negative; received %lld", static_cast<long long>(r));
    }
  }

  void compute(Context& ctx) override {
    const Tensor x = ctx.input(0);
    if (repeats_.size() != x.rank()) {
      fail("expects one repeat per dimension of x: x has shape %s but repeats has %zu entries; "
           "fix: give repeats exactly %zu values", shape_str(x.shape).c_str(), repeats_.size(),
           x.rank());
    }
    if (x.rank() == 0) fail("x must have at least 1 dimension (summed over the last); received a scalar");
    Shape tiled_shape(x.shape);
    for (size_t d = 0; d < x.rank(); ++d) tiled_shape[d] *= repeats_[d];
    const Shape summed_shape(x.shape.begin(), x.shape.end() - 1);
    const Tensor scaled = ctx.output(0, x.shape);
    const Tensor tiled = ctx.output(1, tiled_shape);
    const Tensor summed = ctx.output(2, summed_shape);
    dispatch_float(x.elem, "input x", kFloats, [&](auto tag) {
      using T = typename decltype(tag)::type;
      run<T>(x, scaled, tiled, summed);
    });
  }

  static void infer(const InferContext& ctx) {
    const TypeShape x = ctx.input(0);
    if (!x.present) fail("the element type of input x is unknown at graph time");
    if (!x.has_shape) fail("input x has unknown rank; output shapes left to run time");
    std::vector<int64_t> repeats;
    if (!ctx.attr("repeats", &repeats)) fail("the node lacks the required attribute repeats (INTS)");
    if (repeats.size() != x.dims.size() || x.dims.empty()) {
      fail("repeats has %zu entries but x has rank %zu; expected one repeat per dimension",
           repeats.size(), x.dims.size());
    }
    std::vector<Dim> tiled(x.dims);
    for (size_t d = 0; d < tiled.size(); ++d) {
      if (x.dims[d].is_known()) {
        tiled[d] = Dim::known(x.dims[d].value * repeats[d]);
      } else if (repeats[d] != 1) {
        tiled[d] = Dim::unknown();  // a symbolic dim times r has no name
      }
    }
    ctx.set_output(0, x.elem, x.dims);
    ctx.set_output(1, x.elem, tiled);
    ctx.set_output(2, x.elem, std::vector<Dim>(x.dims.begin(), x.dims.end() - 1));
  }

 private:
  template <typename T>
  void run(const Tensor& x, const Tensor& scaled, const Tensor& tiled,
           const Tensor& summed) const {
    const T* px = x.as<T>();
    const T scale = from_attr<T>(scale_);
    T* ps = scaled.mut<T>();
    for (int64_t i = 0; i < x.size; ++i) ps[i] = mul(px[i], scale);

    const int64_t last = x.shape.back(), rows = last ? x.size / last : numel(summed.shape);
    using Acc = std::conditional_t<std::is_same_v<T, Half>, float, double>;
    T* pm = summed.mut<T>();
    for (int64_t r = 0; r < rows; ++r) {
      Acc acc = 0;
      for (int64_t j = 0; j < last; ++j) acc += static_cast<Acc>(load(px[r * last + j]));
      pm[r] = store<T>(acc);
    }

    // tile: every output row (last dim) is the matching input row repeated repeats.back() times
    const int64_t out_last = tiled.shape.back(), out_rows = out_last ? tiled.size / out_last : 0;
    const size_t rank = x.rank();
    T* pt = tiled.mut<T>();
    std::vector<int64_t> idx(rank, 0);  // output index over the leading dims
    for (int64_t orow = 0; orow < out_rows; ++orow) {
      int64_t src = 0;
      for (size_t d = 0; d + 1 < rank; ++d) src = src * x.shape[d] + idx[d] % x.shape[d];
      const T* row = px + src * last;
      T* dst = pt + orow * out_last;
      for (int64_t k = 0; k < repeats_.back(); ++k) std::copy(row, row + last, dst + k * last);
      for (size_t d = rank - 1; d-- > 0;) {  // advance the leading-dims index
        if (++idx[d] < tiled.shape[d]) break;
        idx[d] = 0;
      }
    }
  }

  std::vector<int64_t> repeats_;
  float scale_;
};

}  // namespace

void add_multi_out3_ops(std::vector<OpDef>& ops) {
  ops.push_back({"onnx_custom", "MultiOut3", {OC_IO_REQUIRED},
                 {OC_IO_REQUIRED, OC_IO_REQUIRED, OC_IO_REQUIRED}, create_kernel<MultiOut3>,
                 MultiOut3::infer});
}

}  // namespace oc
