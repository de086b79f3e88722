// onnx_custom::CustomLinear: y = x @ weight^T (+ bias), F.linear semantics for x of any rank >= 1;
// same semantics as ort_kernels/custom_linear.py. float16/bfloat16 run in float32 and round once per output.
#include <algorithm>

#include "gemm.h"
#include "numeric.h"
#include "ort_gemm.h"

namespace oc {
namespace {

const std::vector<int> kFloats = {OC_ELEM_FLOAT, OC_ELEM_DOUBLE, OC_ELEM_FLOAT16, OC_ELEM_BFLOAT16};
constexpr double kFlopsPerTask = 4e6;  // enough work to pay for a thread-pool task

int input_elem(const OrtKernelInfo* info, size_t index) {
  OrtTypeInfo* type = nullptr;
  if (OrtStatus* st = OC_ORT(KernelInfo_GetInputTypeInfo)(info, index, &type)) {
    OC_ORT(ReleaseStatus)(st);
    return OC_ELEM_UNDEFINED;
  }
  const OrtTensorTypeAndShapeInfo* tensor = nullptr;
  int elem = OC_ELEM_UNDEFINED;
  OrtStatus* st = OC_ORT(CastTypeInfoToTensorInfo)(type, &tensor);
  if (st == nullptr && tensor != nullptr) st = OC_ORT(GetTensorElementType)(tensor, &elem);
  if (st != nullptr) OC_ORT(ReleaseStatus)(st);
  OC_ORT(ReleaseTypeInfo)(type);
  return elem;
}

template <typename T>
std::vector<Compute<T>> widened(const Tensor& t) {
  std::vector<Compute<T>> out(static_cast<size_t>(t.size));
  const T* p = t.as<T>();
  for (int64_t i = 0; i < t.size; ++i) out[i] = load(p[i]);
  return out;
}

class CustomLinear final : public Kernel {
 public:
  explicit CustomLinear(const Attributes& attrs) {
    // float32 runs on ORT's own Gemm (MLAS) by default: measured at par with a plain ORT Gemm
    // node and 1.8-2x faster than our GEMM for few rows, where packing the weight dominates
    // (benchmarks/native_ops.py --only gemm). The node's dtype is known at kernel creation.
    if (input_elem(attrs.raw(), 0) == OC_ELEM_FLOAT) {
      ort_gemm_ = make_ort_gemm(choose_gemm(GemmBackend::ort), attrs.raw(), /*trans_b=*/true);
    }
  }

  void compute(Context& ctx) override {
    const Tensor x = ctx.input(0), w = ctx.input(1), bias = ctx.input(2);
    require_same_dtype("weight", w, "x", x);
    if (bias.present) require_same_dtype("bias", bias, "x", x);
    if (w.rank() != 2 || x.rank() < 1 || x.shape.back() != w.dim(1)) {
      fail("x %s and weight %s do not match; expected x [..., in] and weight [out, in]",
           shape_str(x.shape).c_str(), shape_str(w.shape).c_str());
    }
    const int64_t out_features = w.dim(0), in_features = w.dim(1);
    if (bias.present && !(bias.rank() <= 1 && (bias.size == out_features || bias.size == 1))) {
      fail("bias %s does not match weight %s; expected bias [out] = [%lld]",
           shape_str(bias.shape).c_str(), shape_str(w.shape).c_str(),
           static_cast<long long>(out_features));
    }
    Shape y_shape(x.shape.begin(), x.shape.end() - 1);
    y_shape.push_back(out_features);
    const Tensor y = ctx.output(0, y_shape);
    const int64_t rows = in_features ? x.size / in_features : numel(Shape(x.shape.begin(), x.shape.end() - 1));
    dispatch_float(x.elem, "input x", kFloats, [&](auto tag) {
      using T = typename decltype(tag)::type;
      run<T>(ctx, x, w, bias, y, rows, in_features, out_features);
    });
  }

  static void infer(const InferContext& ctx) {
    const TypeShape x = ctx.input(0), w = ctx.input(1);
    if (!x.present) fail("the element type of input x is unknown at graph time");
    if (!x.has_shape || !w.has_shape) fail("x or weight has unknown rank; output shape left to run time");
    if (x.dims.empty() || w.dims.size() != 2) {
      fail("expected x [..., in] and weight [out, in]; received ranks %zu and %zu", x.dims.size(),
           w.dims.size());
    }
    std::vector<Dim> out(x.dims.begin(), x.dims.end() - 1);
    out.push_back(w.dims[0]);
    ctx.set_output(0, x.elem, out);
  }

 private:
  template <typename T>
  void run(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
           int64_t M, int64_t K, int64_t N) const {
    using C = Compute<T>;
    if (M == 0 || N == 0) return;
    // 16-bit inputs are widened once; float32/float64 are used in place.
    std::vector<C> xw, ww, bw, yw;
    const C* px;
    const C* pw;
    const C* pb = nullptr;
    C* py;
    if constexpr (std::is_same_v<T, C>) {
      px = x.as<C>();
      pw = w.as<C>();
      if (bias.present) pb = bias.as<C>();
      py = y.mut<C>();
    } else {
      xw = widened<T>(x);
      ww = widened<T>(w);
      if (bias.present) bw = widened<T>(bias);
      yw.resize(static_cast<size_t>(M * N));
      px = xw.data();
      pw = ww.data();
      if (bias.present) pb = bw.data();
      py = yw.data();
    }
    std::vector<C> zeros;
    if (pb == nullptr || bias.size == 1) {  // a full bias row keeps one code path below
      zeros.assign(static_cast<size_t>(N), pb == nullptr ? C(0) : pb[0]);
      pb = zeros.data();
    }
    if constexpr (std::is_same_v<C, float>) {
      if (ort_gemm_ && std::is_same_v<T, float> && K > 0) {
        ort_gemm_->run(ctx.raw(), px, pw, pb, false, py, M, N, K);
        return;
      }
    }
    // Split rows (or, for few rows, columns) so every task does enough work.
    const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
    const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(64, static_cast<int64_t>(flops / kFlopsPerTask)));
    const bool by_rows = M >= tasks * 8 || M >= N;
    const int64_t parts = std::min(tasks, by_rows ? M : N);
    ctx.parallel_for(static_cast<size_t>(parts), [&](size_t part) {
      int64_t begin, end;
      chunk_range(by_rows ? M : N, parts, static_cast<int64_t>(part), &begin, &end);
      const int64_t m0 = by_rows ? begin : 0, m1 = by_rows ? end : M;
      const int64_t n0 = by_rows ? 0 : begin, n1 = by_rows ? N : end;
      for (int64_t i = m0; i < m1; ++i) std::copy(pb + n0, pb + n1, py + i * N + n0);
      // B[k, j] = weight[j, k]: the transposed weight is read through strides, no copy
      gemm(m1 - m0, n1 - n0, K, px + m0 * K, K, 1, pw + n0 * K, 1, K, py + m0 * N + n0, N, true);
    });
    if constexpr (!std::is_same_v<T, C>) {
      T* out = y.mut<T>();
      for (int64_t i = 0; i < M * N; ++i) out[i] = store<T>(py[i]);
    }
  }

  std::unique_ptr<OrtGemm> ort_gemm_;
};

}  // namespace

void add_custom_linear_ops(std::vector<OpDef>& ops) {
  ops.push_back({"onnx_custom", "CustomLinear", {OC_IO_REQUIRED, OC_IO_REQUIRED, OC_IO_OPTIONAL},
                 {OC_IO_REQUIRED}, create_kernel<CustomLinear>, CustomLinear::infer});
}

}  // namespace oc
