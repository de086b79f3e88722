// onnx_custom::my_add (y = alpha * a + b, numpy broadcasting) and onnx_custom::multi_out
// ((x * scale, x + shift)): the seed ops, same semantics as ort_kernels/seed.py.
#include <algorithm>

#include "numeric.h"

namespace oc {
namespace {

constexpr int64_t kGrain = 1 << 16;  // elements per parallel task for the elementwise loops

Shape broadcast_shape(const Shape& a, const Shape& b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank, 1);
  for (size_t d = 0; d < rank; ++d) {
    const int64_t x = d + a.size() >= rank ? a[d + a.size() - rank] : 1;
    const int64_t y = d + b.size() >= rank ? b[d + b.size() - rank] : 1;
    if (x != y && x != 1 && y != 1) {
      fail("inputs a %s and b %s do not broadcast (dimension %zu: %lld vs %lld); expected equal "
           "dimensions or 1 (numpy broadcasting); fix: reshape or expand one of them",
           shape_str(a).c_str(), shape_str(b).c_str(), d, static_cast<long long>(x),
           static_cast<long long>(y));
    }
    out[d] = x == 1 ? y : x;
  }
  return out;
}

// Strides (in elements) of `shape` viewed in the broadcast `out` shape: 0 along broadcast dims.
std::vector<int64_t> broadcast_strides(const Shape& shape, const Shape& out) {
  std::vector<int64_t> strides(out.size(), 0);
  int64_t step = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    const size_t src = shape.size() - 1 - i, dst = out.size() - 1 - i;
    strides[dst] = shape[src] == 1 ? 0 : step;
    step *= shape[src];
  }
  return strides;
}

// y[i] = fn(a[i * sa], b[i * sb]) over n elements; sa, sb in {0, 1} (specialized so the common
// cases vectorize).
template <typename T, typename Fn>
inline void binary_run(const T* a, int64_t sa, const T* b, int64_t sb, T* y, int64_t n, Fn fn) {
  if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) y[i] = fn(a[i], b[i]);
  } else if (sa == 1) {
    const T bv = b[0];
    for (int64_t i = 0; i < n; ++i) y[i] = fn(a[i], bv);
  } else if (sb == 1) {
    const T av = a[0];
    for (int64_t i = 0; i < n; ++i) y[i] = fn(av, b[i]);
  } else {
    const T v = fn(a[0], b[0]);
    for (int64_t i = 0; i < n; ++i) y[i] = v;
  }
}

// y = fn(a, b) with numpy broadcasting, split into parallel chunks of the flat output.
template <typename T, typename Fn>
void broadcast_binary(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& y, Fn fn) {
  // Collapse dims into (outer..., inner) where both operands' strides stay regular.
  const Shape& out = y.shape;
  const std::vector<int64_t> sa_full = broadcast_strides(a.shape, out);
  const std::vector<int64_t> sb_full = broadcast_strides(b.shape, out);
  Shape dims;
  std::vector<int64_t> sa, sb;
  for (size_t d = 0; d < out.size(); ++d) {
    if (out[d] == 1) continue;
    if (!dims.empty() && sa.back() == sa_full[d] * out[d] && sb.back() == sb_full[d] * out[d]) {
      dims.back() *= out[d];  // contiguous with the previous dim for both operands
      sa.back() = sa_full[d];
      sb.back() = sb_full[d];
      continue;
    }
    dims.push_back(out[d]);
    sa.push_back(sa_full[d]);
    sb.push_back(sb_full[d]);
  }
  if (dims.empty()) {  // a single element
    dims = {1};
    sa = {0};
    sb = {0};
  }
  const int64_t total = y.size, inner = dims.back(), rank = static_cast<int64_t>(dims.size());
  if (total == 0) return;
  const T* pa = a.as<T>();
  const T* pb = b.as<T>();
  T* py = y.mut<T>();
  const int64_t chunks = std::min<int64_t>((total + kGrain - 1) / kGrain, 256);
  ctx.parallel_for(static_cast<size_t>(chunks), [&](size_t chunk) {
    int64_t begin, end;
    chunk_range(total, chunks, static_cast<int64_t>(chunk), &begin, &end);
    std::vector<int64_t> idx(rank);
    int64_t rest = begin;
    for (int64_t d = rank - 1; d >= 0; --d) {
      idx[d] = rest % dims[d];
      rest /= dims[d];
    }
    for (int64_t pos = begin; pos < end;) {
      int64_t oa = 0, ob = 0;
      for (int64_t d = 0; d < rank; ++d) {
        oa += idx[d] * sa[d];
        ob += idx[d] * sb[d];
      }
      const int64_t run = std::min(end - pos, inner - idx[rank - 1]);
      binary_run(pa + oa, sa[rank - 1], pb + ob, sb[rank - 1], py + pos, run, fn);
      pos += run;
      idx[rank - 1] += run;
      for (int64_t d = rank - 1; d > 0 && idx[d] == dims[d]; --d) {
        idx[d] = 0;
        ++idx[d - 1];
      }
    }
  });
}

// Python's broadcast rule over possibly symbolic dims (runtime/types.py _merge_dim).
Dim merge_dim(const Dim& x, const Dim& y) {
  if (x.value == 1) return y;
  if (y.value == 1 || x == y) return x;
  if (x.is_known() && y.is_known()) {
    fail("inputs do not broadcast: dimension %lld vs %lld", static_cast<long long>(x.value),
         static_cast<long long>(y.value));
  }
  if (x.is_known()) return x;
  if (y.is_known()) return y;
  return Dim::unknown();
}

const TypeShape& require_known(const TypeShape& t, const char* name) {
  if (!t.present) fail("the element type of input %s is unknown at graph time", name);
  return t;
}

void need_rank(const TypeShape& t, const char* name) {
  // Declaring an output without a rank would claim a scalar: leave it to run time instead.
  if (!t.has_shape) fail("input %s has unknown rank; output shape left to run time", name);
}

// ---- onnx_custom::my_add ----------------------------------------------------------------------------------
class MyAdd final : public Kernel {
 public:
  explicit MyAdd(const Attributes& attrs) : alpha_(attrs.float_or("alpha", 2.0f)) {}

  void compute(Context& ctx) override {
    const Tensor a = ctx.input(0), b = ctx.input(1);
    require_same_dtype("input b", b, "input a", a);
    const Tensor y = ctx.output(0, broadcast_shape(a.shape, b.shape));
    dispatch_numeric(a.elem, "input a", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T alpha = from_attr<T>(alpha_);
      broadcast_binary<T>(ctx, a, b, y, [alpha](T x, T z) { return add(mul(x, alpha), z); });
    });
  }

  static void infer(const InferContext& ctx) {
    const TypeShape a = ctx.input(0), b = ctx.input(1);
    require_known(a, "a");
    need_rank(a, "a");
    need_rank(b, "b");
    const size_t rank = std::max(a.dims.size(), b.dims.size());
    std::vector<Dim> out(rank, Dim::known(1));
    for (const TypeShape* t : {&a, &b}) {
      const size_t pad = rank - t->dims.size();
      for (size_t d = 0; d < t->dims.size(); ++d) out[pad + d] = merge_dim(out[pad + d], t->dims[d]);
    }
    ctx.set_output(0, a.elem, out);
  }

 private:
  float alpha_;
};

// ---- onnx_custom::multi_out --------------------------------------------------------------------------------
class MultiOut final : public Kernel {
 public:
  explicit MultiOut(const Attributes& attrs)
      : scale_(attrs.float_or("scale", 2.0f)), shift_(attrs.float_or("shift", 3.0f)) {}

  void compute(Context& ctx) override {
    const Tensor x = ctx.input(0);
    const Tensor scaled = ctx.output(0, x.shape), shifted = ctx.output(1, x.shape);
    dispatch_numeric(x.elem, "input x", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T scale = from_attr<T>(scale_), shift = from_attr<T>(shift_);
      const T* px = x.as<T>();
      T* ps = scaled.mut<T>();
      T* pt = shifted.mut<T>();
      const int64_t total = x.size, chunks = std::min<int64_t>((total + kGrain - 1) / kGrain, 256);
      ctx.parallel_for(static_cast<size_t>(chunks), [&](size_t chunk) {
        int64_t begin, end;
        chunk_range(total, chunks, static_cast<int64_t>(chunk), &begin, &end);
        for (int64_t i = begin; i < end; ++i) {
          ps[i] = mul(px[i], scale);
          pt[i] = add(px[i], shift);
        }
      });
    });
  }

  static void infer(const InferContext& ctx) {
    const TypeShape x = ctx.input(0);
    require_known(x, "x");
    need_rank(x, "x");
    ctx.set_output(0, x.elem, x.dims);
    ctx.set_output(1, x.elem, x.dims);
  }

 private:
  float scale_, shift_;
};

}  // namespace

void add_seed_ops(std::vector<OpDef>& ops) {
  ops.push_back({"onnx_custom", "my_add", {OC_IO_REQUIRED, OC_IO_REQUIRED}, {OC_IO_REQUIRED},
                 create_kernel<MyAdd>, MyAdd::infer});
  ops.push_back({"onnx_custom", "multi_out", {OC_IO_REQUIRED}, {OC_IO_REQUIRED, OC_IO_REQUIRED},
                 create_kernel<MultiOut>, MultiOut::infer});
}

}  // namespace oc
