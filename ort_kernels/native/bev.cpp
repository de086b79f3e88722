// bev::BEVPoolV2 (BEVDet's voxel pooling): for every interval k, the BEV cell
// ranks_bev[starts[k]] receives sum over i in [starts[k], starts[k] + lengths[k]) of
// depth.flat[ranks_depth[i]] * feat_rows[ranks_feat[i], :]; points outside every interval are
// ignored; output (B, C, Z, Y, X) in feat's dtype. Semantics of ort_kernels/bev.py; intervals
// that share a cell add up, like the eager op (the Python kernel keeps the last one).
#include <algorithm>

#include "numeric.h"

namespace oc {
namespace {

const std::vector<int> kFloats = {OC_ELEM_FLOAT, OC_ELEM_DOUBLE, OC_ELEM_FLOAT16, OC_ELEM_BFLOAT16};
const std::vector<int> kIndex = {OC_ELEM_INT32, OC_ELEM_INT64};
constexpr int64_t kPointsPerTask = 4096;

// A 1-D int32 or int64 tensor read as int64.
struct Index {
  const int32_t* narrow = nullptr;
  const int64_t* wide = nullptr;
  int64_t size = 0;
  int64_t operator[](int64_t i) const { return wide ? wide[i] : narrow[i]; }
};

Index index_input(const Tensor& t, const char* name) {
  require_dtype(name, t, kIndex);
  if (t.rank() != 1) {
    fail("%s must be a 1-D int32/int64 tensor; received shape %s", name, shape_str(t.shape).c_str());
  }
  Index ix;
  ix.size = t.size;
  if (t.elem == OC_ELEM_INT64) ix.wide = t.as<int64_t>();
  else ix.narrow = t.as<int32_t>();
  return ix;
}

void check_range(const Index& ix, const char* name, int64_t upper) {
  for (int64_t i = 0; i < ix.size; ++i) {
    const int64_t v = ix[i];
    if (v < 0 || v >= upper) {
      fail("%s must lie in [0, %lld); received %lld at position %lld", name,
           static_cast<long long>(upper), static_cast<long long>(v), static_cast<long long>(i));
    }
  }
}

// depth values read as the accumulation type, whatever depth's float dtype.
template <typename A>
struct DepthReader {
  const void* data;
  int elem;
  A operator()(int64_t i) const {
    switch (elem) {
      case OC_ELEM_FLOAT: return static_cast<A>(static_cast<const float*>(data)[i]);
      case OC_ELEM_DOUBLE: return static_cast<A>(static_cast<const double*>(data)[i]);
      case OC_ELEM_BFLOAT16: return static_cast<A>(load(static_cast<const BFloat16*>(data)[i]));
      default: return static_cast<A>(load(static_cast<const Half*>(data)[i]));
    }
  }
};

class BEVPoolV2 final : public Kernel {
 public:
  explicit BEVPoolV2(const Attributes& attrs) : shape_(attrs.ints("bev_feat_shape")) {
    if (shape_.size() != 5) {
      fail("bev_feat_shape must hold 5 values [B, Z, Y, X, C]; received %zu", shape_.size());
    }
    int64_t total = 1;
    for (int64_t s : shape_) {
      if (s < 1) fail("bev_feat_shape must be positive; received %s", shape_str(shape_).c_str());
      if (s > (int64_t(1) << 40) / total) {
        fail("bev_feat_shape %s describes more than 2^40 elements", shape_str(shape_).c_str());
      }
      total *= s;
    }
  }

  void compute(Context& ctx) override {
    const Tensor depth = ctx.input(0), feat = ctx.input(1);
    require_dtype("depth", depth, kFloats);
    require_dtype("feat", feat, kFloats);
    require_rank("depth", depth, 5, "(B, N, D, fH, fW)");
    require_rank("feat", feat, 5, "(B, N, fH, fW, C)");
    if (depth.dim(0) != feat.dim(0) || depth.dim(1) != feat.dim(1) ||
        depth.dim(3) != feat.dim(2) || depth.dim(4) != feat.dim(3)) {
      fail("depth %s and feat %s disagree on (B, N, fH, fW)", shape_str(depth.shape).c_str(),
           shape_str(feat.shape).c_str());
    }
    const int64_t B = shape_[0], Z = shape_[1], Y = shape_[2], X = shape_[3], C = shape_[4];
    if (B != depth.dim(0) || C != feat.dim(4)) {
      fail("bev_feat_shape %s must start with B=%lld (depth) and end with C=%lld (feat)",
           shape_str(shape_).c_str(), static_cast<long long>(depth.dim(0)),
           static_cast<long long>(feat.dim(4)));
    }
    const Index rd = index_input(ctx.input(2), "ranks_depth");
    const Index rf = index_input(ctx.input(3), "ranks_feat");
    const Index rb = index_input(ctx.input(4), "ranks_bev");
    const Index starts = index_input(ctx.input(5), "interval_starts");
    const Index lengths = index_input(ctx.input(6), "interval_lengths");
    if (rd.size != rf.size || rd.size != rb.size) {
      fail("ranks_depth, ranks_feat and ranks_bev must have one length P; received %lld, %lld, %lld",
           static_cast<long long>(rd.size), static_cast<long long>(rf.size),
           static_cast<long long>(rb.size));
    }
    if (starts.size != lengths.size) {
      fail("interval_starts and interval_lengths must have one length; received %lld and %lld",
           static_cast<long long>(starts.size), static_cast<long long>(lengths.size));
    }
    const int64_t cells = Z * Y * X, points = rd.size;
    check_range(rd, "ranks_depth", depth.size);
    check_range(rf, "ranks_feat", feat.size / C);
    check_range(rb, "ranks_bev", B * cells);
    for (int64_t k = 0; k < starts.size; ++k) {
      const int64_t s = starts[k], n = lengths[k];
      if (s < 0 || n < 0 || n > points - s) {
        fail("interval %lld = [%lld, %lld + %lld) must lie within the %lld ranks; expected "
             "0 <= start, 0 <= length, start + length <= P", static_cast<long long>(k),
             static_cast<long long>(s), static_cast<long long>(s), static_cast<long long>(n),
             static_cast<long long>(points));
      }
    }
    const Tensor out = ctx.output(0, {B, C, Z, Y, X});
    dispatch_float(feat.elem, "feat", kFloats, [&](auto tag) {
      using T = typename decltype(tag)::type;
      pool<T>(ctx, depth, feat, rd, rf, rb, starts, lengths, out, cells, C);
    });
  }

  static void infer(const InferContext& ctx) {
    const TypeShape feat = ctx.input(1);
    if (!feat.present) fail("the element type of input feat is unknown at graph time");
    std::vector<int64_t> s;
    if (!ctx.attr("bev_feat_shape", &s)) fail("the node lacks the required attribute bev_feat_shape (INTS)");
    if (s.size() != 5) fail("bev_feat_shape must hold 5 values [B, Z, Y, X, C]");
    ctx.set_output(0, feat.elem, {Dim::known(s[0]), Dim::known(s[4]), Dim::known(s[1]),
                                  Dim::known(s[2]), Dim::known(s[3])});
  }

 private:
  template <typename T>
  void pool(Context& ctx, const Tensor& depth, const Tensor& feat, const Index& rd,
            const Index& rf, const Index& rb, const Index& starts, const Index& lengths,
            const Tensor& out, int64_t cells, int64_t C) const {
    using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const DepthReader<A> depth_at{depth.data, depth.elem};
    const T* rows = feat.as<T>();
    T* dst = out.mut<T>();
    const int64_t intervals = starts.size, batches = shape_[0];
    // Distinct target cells let intervals run in parallel and store; shared cells accumulate.
    std::vector<uint8_t> seen(static_cast<size_t>(batches * cells), 0);
    bool shared = false;
    for (int64_t k = 0; k < intervals && !shared; ++k) {
      if (lengths[k] == 0) continue;
      uint8_t& mark = seen[static_cast<size_t>(rb[starts[k]])];
      shared = mark != 0;
      mark = 1;
    }
    const T zero = store<T>(0.0f);
    std::fill(dst, dst + out.size, zero);
    const int64_t tasks = shared ? 1 : std::max<int64_t>(1, std::min<int64_t>(256, rd.size / kPointsPerTask));
    ctx.parallel_for(static_cast<size_t>(tasks), [&](size_t task) {
      int64_t k0, k1;
      chunk_range(intervals, tasks, static_cast<int64_t>(task), &k0, &k1);
      std::vector<A> acc(static_cast<size_t>(C));
      for (int64_t k = k0; k < k1; ++k) {
        const int64_t s = starts[k], n = lengths[k];
        if (n == 0) continue;
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t i = s; i < s + n; ++i) {
          const A w = depth_at(rd[i]);
          const T* row = rows + rf[i] * C;
          A* a = acc.data();
          for (int64_t c = 0; c < C; ++c) a[c] += w * static_cast<A>(load(row[c]));
        }
        const int64_t cell = rb[s], b = cell / cells, at = cell % cells;
        T* base = dst + b * C * cells + at;
        for (int64_t c = 0; c < C; ++c) {
          base[c * cells] = shared ? store<T>(static_cast<A>(load(base[c * cells])) + acc[c])
                                   : store<T>(acc[c]);
        }
      }
    });
  }

  std::vector<int64_t> shape_;
};

}  // namespace

void add_bev_ops(std::vector<OpDef>& ops) {
  ops.push_back({"bev", "BEVPoolV2", std::vector<int>(7, OC_IO_REQUIRED), {OC_IO_REQUIRED},
                 create_kernel<BEVPoolV2>, BEVPoolV2::infer});
}

}  // namespace oc
