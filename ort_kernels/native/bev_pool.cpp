// onnx_custom::BEVPoolV2 (BEVDet's voxel pooling): for every interval k, the BEV cell
// ranks_bev[starts[k]] receives sum over i in [starts[k], starts[k] + lengths[k]) of
// depth.flat[ranks_depth[i]] * feat_rows[ranks_feat[i], :]; points outside every interval are
// ignored; output (B, C, Z, Y, X) in feat's dtype. Semantics of ort_kernels/bev_pool.py; intervals
// that share a cell add up, like the eager op and the Python kernel.
#include <algorithm>
#include <memory>

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

// Is every p[i], i in [begin, end), in [0, upper)? A min/max reduction in I, which vectorises
// with baseline SIMD; the exact position of a bad value is then found by check_range.
template <typename I>
bool all_in_range(const I* p, int64_t begin, int64_t end, int64_t upper) {
  if (begin >= end) return true;
  I lo = p[begin], hi = p[begin];
  for (int64_t i = begin; i < end; ++i) {
    lo = p[i] < lo ? p[i] : lo;
    hi = p[i] > hi ? p[i] : hi;
  }
  return lo >= 0 && static_cast<int64_t>(hi) < upper;
}

bool all_in_range(const Index& ix, int64_t begin, int64_t end, int64_t upper) {
  return ix.wide ? all_in_range(ix.wide, begin, end, upper) : all_in_range(ix.narrow, begin, end, upper);
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

// Channels go in blocks of four vector-extension values (GCC/Clang) that stay in SIMD registers
// while an interval's points stream by, like the eager op's kernel (onnx_custom/ops/csrc/
// bev_pool.cpp). Bytes = 16 is the baseline x86-64/arm64 width the library is built for (wider
// generic vectors spill there); Bytes = 32 runs in a function compiled for AVX2 (see below).
template <typename A, int Bytes>
struct Vec {
  typedef A type __attribute__((vector_size(Bytes)));
  static constexpr int64_t lanes = Bytes / sizeof(A);
};

// Vectors travel by reference: a by-value 32-byte vector outside AVX code is an ABI change GCC
// warns about (-Wpsabi).
template <typename A, int Bytes, typename T>
__attribute__((always_inline)) inline void load_vec(const T* p, typename Vec<A, Bytes>::type& v) {
  if constexpr (std::is_same_v<A, T>) {
    std::memcpy(&v, p, sizeof(v));
  } else {
    for (int64_t j = 0; j < Vec<A, Bytes>::lanes; ++j) v[j] = static_cast<A>(load(p[j]));
  }
}

template <typename A, int Bytes, typename T>
__attribute__((always_inline)) inline void store_vec(T* p, const typename Vec<A, Bytes>::type& v) {
  if constexpr (std::is_same_v<A, T>) {
    std::memcpy(p, &v, sizeof(v));
  } else {
    for (int64_t j = 0; j < Vec<A, Bytes>::lanes; ++j) p[j] = store<T>(v[j]);
  }
}

// Everything one interval needs. Accumulation type A: float for float/float16/bfloat16, double for
// double; point by point in index order (as the eager op).
template <typename T>
struct Pooling {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  DepthReader<A> depth_at;
  const T* feat_rows;
  const Index *rd, *rf, *rb, *starts, *lengths;
  const uint8_t* first;  // interval k is the first of its cell: store, not add
  T* rows;               // one row of C channels per BEV cell
  int64_t C;
};

// Intervals [k0, k1): gather each one's points once (depth weight, feature row), then sum them
// channel block by channel block into the cell's row.
template <int Bytes, typename T>
__attribute__((always_inline)) inline void sum_intervals(const Pooling<T>& job, int64_t k0, int64_t k1) {
  using A = typename Pooling<T>::A;
  using V = typename Vec<A, Bytes>::type;
  constexpr int64_t L = Vec<A, Bytes>::lanes;
  const int64_t C = job.C;
  std::vector<A> weight;
  std::vector<const T*> src;
  for (int64_t k = k0; k < k1; ++k) {
    const int64_t s = (*job.starts)[k], n = (*job.lengths)[k];
    if (n == 0) continue;
    weight.resize(static_cast<size_t>(n));
    src.resize(static_cast<size_t>(n));
    for (int64_t q = 0; q < n; ++q) {
      weight[q] = job.depth_at((*job.rd)[s + q]);
      src[q] = job.feat_rows + (*job.rf)[s + q] * C;
    }
    T* dst = job.rows + (*job.rb)[s] * C;
    const bool store_only = job.first[k] != 0;
    int64_t c0 = 0;
    for (; c0 + 4 * L <= C; c0 += 4 * L) {
      V a[4] = {}, x = {};
      for (int64_t q = 0; q < n; ++q) {
        for (int v = 0; v < 4; ++v) {
          load_vec<A, Bytes>(src[q] + c0 + v * L, x);
          a[v] += weight[q] * x;
        }
      }
      for (int v = 0; v < 4; ++v) {
        if (!store_only) {
          load_vec<A, Bytes>(dst + c0 + v * L, x);
          a[v] = x + a[v];
        }
        store_vec<A, Bytes>(dst + c0 + v * L, a[v]);
      }
    }
    for (; c0 + L <= C; c0 += L) {  // e.g. C = 80 on AVX2: 2 blocks of 32, then 2 of 8
      V a = {}, x = {};
      for (int64_t q = 0; q < n; ++q) {
        load_vec<A, Bytes>(src[q] + c0, x);
        a += weight[q] * x;
      }
      if (!store_only) {
        load_vec<A, Bytes>(dst + c0, x);
        a = x + a;
      }
      store_vec<A, Bytes>(dst + c0, a);
    }
    for (; c0 < C; ++c0) {
      A acc = 0;
      for (int64_t q = 0; q < n; ++q) acc += weight[q] * static_cast<A>(load(src[q][c0]));
      dst[c0] = store<T>(store_only ? acc : static_cast<A>(load(dst[c0])) + acc);
    }
  }
}

// The AVX2 build of sum_intervals, chosen at run time where the CPU has AVX2: twice the lanes per
// instruction. Same operations in the same order (no FMA contraction), so the same results.
#if defined(__x86_64__) && defined(__GNUC__)
#define OC_BEV_AVX2 1
template <typename T>
__attribute__((target("avx2"))) void sum_intervals_avx2(const Pooling<T>& job, int64_t k0, int64_t k1) {
  sum_intervals<32>(job, k0, k1);
}
#endif

template <typename T>
void sum_intervals_any(const Pooling<T>& job, int64_t k0, int64_t k1) {
#ifdef OC_BEV_AVX2
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return sum_intervals_avx2(job, k0, k1);
#endif
  sum_intervals<16>(job, k0, k1);
}

// One row of C channels per cell (B * cells, C) -> channels-first (B, C, cells); cells no
// interval wrote (`written` 0) become zeros. Tiles of 16 channels x 256 cells keep their row lines
// (16 KiB) in L1 while each channel writes a 1 KiB run (a direct strided store per channel would
// walk cells-sized steps); 1024-cell tiles (64 KiB of row lines) fall out of L1.
template <typename T>
void rows_to_channels_first(Context& ctx, const T* rows, const uint8_t* written, T* out, int64_t B,
                            int64_t C, int64_t S) {
  constexpr int64_t kChannels = 16, kCells = 256;
  const int64_t ctiles = (C + kChannels - 1) / kChannels, stiles = (S + kCells - 1) / kCells;
  const T zero = store<T>(0.0f);
  ctx.parallel_for(static_cast<size_t>(B * stiles * ctiles), [&](size_t task) {
    const int64_t t = static_cast<int64_t>(task);
    const int64_t b = t / (stiles * ctiles), st = (t / ctiles) % stiles, ct = t % ctiles;
    const int64_t s0 = st * kCells, s1 = std::min(S, s0 + kCells);
    const int64_t c0 = ct * kChannels, c1 = std::min(C, c0 + kChannels);
    const T* rw = rows + b * S * C;
    const uint8_t* seen = written + b * S;
    T* cf = out + b * C * S;
    for (int64_t c = c0; c < c1; ++c) {
      T* dst = cf + c * S;
      for (int64_t j = s0; j < s1; ++j) dst[j] = seen[j] ? rw[j * C + c] : zero;
    }
  });
}

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
    // A parallel, branch-free pass; when it finds a bad rank, the serial one names the first.
    const int64_t checks = std::max<int64_t>(1, std::min<int64_t>(64, points / (16 * kPointsPerTask)));
    std::vector<uint8_t> ranks_ok(static_cast<size_t>(checks), 0);
    ctx.parallel_for(static_cast<size_t>(checks), [&](size_t task) {
      int64_t i0, i1;
      chunk_range(points, checks, static_cast<int64_t>(task), &i0, &i1);
      ranks_ok[task] = all_in_range(rd, i0, i1, depth.size) && all_in_range(rf, i0, i1, feat.size / C) &&
                       all_in_range(rb, i0, i1, B * cells);
    });
    if (std::find(ranks_ok.begin(), ranks_ok.end(), 0) != ranks_ok.end()) {
      check_range(rd, "ranks_depth", depth.size);
      check_range(rf, "ranks_feat", feat.size / C);
      check_range(rb, "ranks_bev", B * cells);
    }
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
  // The eager op's forward strategy: intervals in parallel (sum_intervals), each stored as one
  // row per BEV cell; a tiled transpose makes the channels-first output.
  template <typename T>
  void pool(Context& ctx, const Tensor& depth, const Tensor& feat, const Index& rd,
            const Index& rf, const Index& rb, const Index& starts, const Index& lengths,
            const Tensor& out, int64_t cells, int64_t C) const {
    const int64_t intervals = starts.size, batches = shape_[0];
    // written[cell]: some interval stores it. first[k]: interval k is the first (non-empty) one
    // of its cell, so it stores rather than adds. Shared cells run serially, in interval order.
    std::vector<uint8_t> written(static_cast<size_t>(batches * cells), 0);
    std::vector<uint8_t> first(static_cast<size_t>(intervals), 0);
    bool shared = false;
    for (int64_t k = 0; k < intervals; ++k) {
      if (lengths[k] == 0) continue;
      uint8_t& mark = written[static_cast<size_t>(rb[starts[k]])];
      shared = shared || mark != 0;
      first[k] = mark == 0;
      mark = 1;
    }
    std::unique_ptr<T[]> rows(new T[static_cast<size_t>(batches * cells * C)]);
    const Pooling<T> job{{depth.data, depth.elem}, feat.as<T>(), &rd, &rf, &rb, &starts, &lengths,
                         first.data(), rows.get(), C};
    const int64_t tasks = shared ? 1 : std::max<int64_t>(1, std::min<int64_t>(256, rd.size / kPointsPerTask));
    ctx.parallel_for(static_cast<size_t>(tasks), [&](size_t task) {
      int64_t k0, k1;
      chunk_range(intervals, tasks, static_cast<int64_t>(task), &k0, &k1);
      sum_intervals_any(job, k0, k1);
    });
    rows_to_channels_first(ctx, rows.get(), written.data(), out.mut<T>(), batches, C, cells);
  }

  std::vector<int64_t> shape_;
};

}  // namespace

void add_bev_pool_ops(std::vector<OpDef>& ops) {
  ops.push_back({"onnx_custom", "BEVPoolV2", std::vector<int>(7, OC_IO_REQUIRED), {OC_IO_REQUIRED},
                 create_kernel<BEVPoolV2>, BEVPoolV2::infer});
}

}  // namespace oc
