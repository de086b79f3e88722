// bev_pool_v2 (BEVDet voxel pooling) for CPU: gather, multiply and accumulate fused per interval,
// so no (points x channels) temporary is ever made. Shapes and dtypes are checked in Python
// (shared with the fake kernel); index values are checked here, inline: an out-of-range index is
// skipped and reported through the returned flag, and Python then raises the detailed error.
//
// Accumulation: in at::opmath_type (float for float, float16 and bfloat16; double for double),
// point by point in index order, like index_add_ did.
#include <torch/extension.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

struct Sizes {
  int64_t points, intervals, channels, depth_numel, feat_rows, cells;
};

// Channels-first (B, C, S) <-> one row of C channels per cell (B, S, C), S = Z*Y*X. The kernels
// work on rows; the op's output (and its grad) is channels-first. ATen's permute + contiguous takes
// ~4 ms for 128x128x80 floats here (it walks 64 KiB-strided columns). Tiles of 16 channels x 1024
// cells touch each row-side cache line while it is cached and stream the channels-first side.
template <bool kToRows, typename T>
void transpose_cells(T* channels_first, T* rows, int64_t B, int64_t C, int64_t S) {
  constexpr int64_t kChannels = 16, kCells = 1024;
  const int64_t ctiles = (C + kChannels - 1) / kChannels, stiles = (S + kCells - 1) / kCells;
  at::parallel_for(0, B * stiles * ctiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / (stiles * ctiles), st = (t / ctiles) % stiles, ct = t % ctiles;
      const int64_t s0 = st * kCells, s1 = std::min(S, s0 + kCells);
      const int64_t c0 = ct * kChannels, c1 = std::min(C, c0 + kChannels);
      T* cf = channels_first + b * C * S;
      T* rw = rows + b * S * C;
      if constexpr (kToRows) {  // write whole row lines, read 16 sequential streams
        for (int64_t j = s0; j < s1; ++j) {
          for (int64_t c = c0; c < c1; ++c) rw[j * C + c] = cf[c * S + j];
        }
      } else {  // write 4 KiB runs, read the tile's row lines (64 KiB, cached) 16 times
        for (int64_t c = c0; c < c1; ++c) {
          for (int64_t j = s0; j < s1; ++j) cf[c * S + j] = rw[j * C + c];
        }
      }
    }
  });
}

template <typename index_t>
struct Ranks {
  const index_t* depth;
  const index_t* feat;
  const index_t* bev;
  const index_t* starts;
  const index_t* lengths;
};

// Interval k as [begin, end) over the points, or false when it is empty or out of range (then
// `bad` is raised unless it is merely empty).
template <typename index_t>
inline bool interval(const Ranks<index_t>& r, const Sizes& s, int64_t k, int64_t* begin,
                     int64_t* end, int64_t* cell, std::atomic<bool>& bad) {
  const int64_t b = r.starts[k], n = r.lengths[k];
  if (n <= 0) {
    if (n < 0) bad = true;
    return false;
  }
  if (b < 0 || b + n > s.points) {
    bad = true;
    return false;
  }
  const int64_t c = r.bev[b];
  if (c < 0 || c >= s.cells) {
    bad = true;
    return false;
  }
  *begin = b;
  *end = b + n;
  *cell = c;
  return true;
}

template <typename index_t>
inline bool point(const Ranks<index_t>& r, const Sizes& s, int64_t i, int64_t* d, int64_t* f,
                  std::atomic<bool>& bad) {
  *d = r.depth[i];
  *f = r.feat[i];
  if (*d < 0 || *d >= s.depth_numel || *f < 0 || *f >= s.feat_rows) {
    bad = true;
    return false;
  }
  return true;
}

// Do the non-empty intervals write distinct cells? (Then they may run in parallel.)
template <typename index_t>
bool distinct_cells(const Ranks<index_t>& r, const Sizes& s) {
  std::vector<uint8_t> seen(static_cast<size_t>(s.cells), 0);
  for (int64_t k = 0; k < s.intervals; ++k) {
    const int64_t b = r.starts[k];
    if (r.lengths[k] <= 0 || b < 0 || b >= s.points) continue;
    const int64_t c = r.bev[b];
    if (c < 0 || c >= s.cells) continue;  // reported by the kernel
    if (seen[c]) return false;
    seen[c] = 1;
  }
  return true;
}

// One interval's valid points: depth weight and feature-row offset, checked once and reused by
// every channel block.
template <typename acc_t>
struct Points {
  std::vector<acc_t> weight;
  std::vector<int64_t> row;  // f * C
  int64_t count = 0;
};

template <typename scalar_t, typename index_t>
void gather_points(const scalar_t* depth, const Ranks<index_t>& r, const Sizes& s, int64_t begin,
                   int64_t end, Points<at::opmath_type<scalar_t>>& p, std::atomic<bool>& bad) {
  const size_t n = static_cast<size_t>(end - begin);
  if (p.weight.size() < n) {
    p.weight.resize(n);
    p.row.resize(n);
  }
  int64_t m = 0;
  for (int64_t i = begin; i < end; ++i) {
    int64_t d, f;
    if (!point(r, s, i, &d, &f, bad)) continue;
    p.weight[m] = static_cast<at::opmath_type<scalar_t>>(depth[d]);
    p.row[m] = f * s.channels;
    ++m;
  }
  p.count = m;
}

// Channels go in blocks of two 32-byte GCC/Clang vector-extension values (2 x 8 floats, or 2 x 4
// doubles), which stay in SIMD registers while an interval's points stream by. (A plain
// accumulator array became scalar registers and scalar FMAs; a 64-byte vector type spilled.)
template <typename T>
struct Vec {
  typedef T type __attribute__((vector_size(32)));
  static constexpr int64_t lanes = 32 / sizeof(T);
  static constexpr int64_t block = 2 * lanes;  // channels per block
};

template <typename acc_t, typename T>
inline typename Vec<acc_t>::type load_vec(const T* p) {
  typename Vec<acc_t>::type v;
  if constexpr (std::is_same_v<acc_t, T>) {
    std::memcpy(&v, p, sizeof(v));
  } else {
    for (int64_t j = 0; j < Vec<acc_t>::lanes; ++j) v[j] = static_cast<acc_t>(p[j]);
  }
  return v;
}

template <typename acc_t, typename T>
inline void store_vec(T* p, const typename Vec<acc_t>::type& v) {
  if constexpr (std::is_same_v<acc_t, T>) {
    std::memcpy(p, &v, sizeof(v));
  } else {
    for (int64_t j = 0; j < Vec<acc_t>::lanes; ++j) p[j] = static_cast<T>(v[j]);
  }
}

template <typename scalar_t, typename index_t>
void forward_kernel(const scalar_t* depth, const scalar_t* feat, const Ranks<index_t>& r,
                    const Sizes& s, scalar_t* out, std::atomic<bool>& bad) {
  using acc_t = at::opmath_type<scalar_t>;
  using vec = typename Vec<acc_t>::type;
  constexpr int64_t L = Vec<acc_t>::lanes, kBlock = Vec<acc_t>::block;
  const int64_t C = s.channels;
  // Intervals sharing a cell would race; BEVDet's intervals never do, anything else runs serially.
  const int64_t grain = distinct_cells(r, s) ? 16 : s.intervals;
  at::parallel_for(0, s.intervals, grain, [&](int64_t k0, int64_t k1) {
    Points<acc_t> p;
    for (int64_t k = k0; k < k1; ++k) {
      int64_t begin, end, cell;
      if (!interval(r, s, k, &begin, &end, &cell, bad)) continue;
      gather_points(depth, r, s, begin, end, p, bad);
      const int64_t m = p.count;
      scalar_t* dst = out + cell * C;
      int64_t c0 = 0;
      for (; c0 + kBlock <= C; c0 += kBlock) {
        vec a0 = {}, a1 = {};
        for (int64_t q = 0; q < m; ++q) {
          const scalar_t* row = feat + p.row[q] + c0;
          a0 += p.weight[q] * load_vec<acc_t>(row);
          a1 += p.weight[q] * load_vec<acc_t>(row + L);
        }
        store_vec<acc_t>(dst + c0, load_vec<acc_t>(dst + c0) + a0);
        store_vec<acc_t>(dst + c0 + L, load_vec<acc_t>(dst + c0 + L) + a1);
      }
      for (; c0 < C; ++c0) {
        acc_t acc = 0;
        for (int64_t q = 0; q < m; ++q) acc += p.weight[q] * static_cast<acc_t>(feat[p.row[q] + c0]);
        dst[c0] = static_cast<scalar_t>(static_cast<acc_t>(dst[c0]) + acc);
      }
    }
  });
}

// Both gradients in one pass over the points, grouped by feature row (a counting sort, O(points)):
//   grad_feat[f] = sum over the points of row f of depth[d] * grad[cell]
//   grad_depth[d] += dot(grad[cell], feat[f])
// A group's sum stays in one thread (no races, each row written once) and reads its feature row
// once; groups keep interval order, so each row accumulates in the same order as a serial loop.
template <typename scalar_t, typename index_t>
void backward_kernel(const scalar_t* depth, const scalar_t* feat, const scalar_t* grad,
                     const Ranks<index_t>& r, const Sizes& s, at::opmath_type<scalar_t>* grad_depth,
                     at::opmath_type<scalar_t>* grad_feat, std::atomic<bool>& bad) {
  using acc_t = at::opmath_type<scalar_t>;
  using vec = typename Vec<acc_t>::type;
  constexpr int64_t L = Vec<acc_t>::lanes;
  const int64_t C = s.channels;
  // (point, cell) entries of every valid point of every interval, bucketed by feature row.
  std::vector<int64_t> first(static_cast<size_t>(s.feat_rows + 1), 0);
  for (int64_t k = 0; k < s.intervals; ++k) {
    int64_t begin, end, cell;
    if (!interval(r, s, k, &begin, &end, &cell, bad)) continue;
    for (int64_t i = begin; i < end; ++i) {
      int64_t d, f;
      if (point(r, s, i, &d, &f, bad)) ++first[f + 1];
    }
  }
  for (int64_t f = 0; f < s.feat_rows; ++f) first[f + 1] += first[f];
  std::vector<int64_t> cursor(first.begin(), first.end() - 1);
  std::vector<int64_t> entry_point(static_cast<size_t>(first[s.feat_rows]));
  std::vector<int64_t> entry_cell(entry_point.size());
  std::atomic<bool> ignored{false};  // reported by the pass above
  for (int64_t k = 0; k < s.intervals; ++k) {
    int64_t begin, end, cell;
    if (!interval(r, s, k, &begin, &end, &cell, ignored)) continue;
    for (int64_t i = begin; i < end; ++i) {
      int64_t d, f;
      if (!point(r, s, i, &d, &f, ignored)) continue;
      const int64_t at = cursor[f]++;
      entry_point[at] = i;
      entry_cell[at] = cell;
    }
  }
  std::vector<acc_t> dots(static_cast<size_t>(s.points), acc_t(0));
  at::parallel_for(0, s.feat_rows, 64, [&](int64_t f0, int64_t f1) {
    std::vector<acc_t> acc(static_cast<size_t>(C));
    for (int64_t f = f0; f < f1; ++f) {
      if (first[f] == first[f + 1]) continue;
      std::fill(acc.begin(), acc.end(), acc_t(0));
      const scalar_t* row = feat + f * C;
      for (int64_t e = first[f]; e < first[f + 1]; ++e) {
        const int64_t i = entry_point[e];
        const acc_t w = static_cast<acc_t>(depth[r.depth[i]]);
        const scalar_t* g = grad + entry_cell[e] * C;
        vec lanes = {};
        int64_t c = 0;
        for (; c + L <= C; c += L) {
          const vec gv = load_vec<acc_t>(g + c);
          store_vec<acc_t>(acc.data() + c, load_vec<acc_t>(acc.data() + c) + w * gv);
          lanes += gv * load_vec<acc_t>(row + c);
        }
        acc_t dot = 0;
        for (int64_t j = 0; j < L; ++j) dot += lanes[j];
        for (; c < C; ++c) {
          const acc_t gc = static_cast<acc_t>(g[c]);
          acc[c] += w * gc;
          dot += gc * static_cast<acc_t>(row[c]);
        }
        dots[i] += dot;  // a point in several intervals has several entries, all in this group
      }
      std::copy(acc.begin(), acc.end(), grad_feat + f * C);
    }
  });
  // Uncovered points hold a zero dot; their depth index may be anything (ignored, like the op).
  for (int64_t i = 0; i < s.points; ++i) {
    const int64_t d = r.depth[i];
    if (d >= 0 && d < s.depth_numel) grad_depth[d] += dots[i];
  }
}

// All five index tensors as one dtype: int32 when they all are, else int64.
std::vector<at::Tensor> index_tensors(const std::vector<at::Tensor>& ranks) {
  const bool all32 = std::all_of(ranks.begin(), ranks.end(),
                                 [](const at::Tensor& t) { return t.scalar_type() == at::kInt; });
  std::vector<at::Tensor> result;
  for (const auto& t : ranks) result.push_back(t.to(all32 ? at::kInt : at::kLong).contiguous());
  return result;
}

template <typename index_t>
Ranks<index_t> ranks_of(const std::vector<at::Tensor>& idx) {
  return {idx[0].data_ptr<index_t>(), idx[1].data_ptr<index_t>(), idx[2].data_ptr<index_t>(),
          idx[3].data_ptr<index_t>(), idx[4].data_ptr<index_t>()};
}

Sizes sizes_of(const at::Tensor& depth, const at::Tensor& feat, const std::vector<at::Tensor>& idx,
               int64_t cells) {
  const int64_t C = feat.size(-1);
  return {idx[0].numel(), idx[3].numel(), C, depth.numel(), C ? feat.numel() / C : 0, cells};
}

template <typename F>
void with_index_type(const std::vector<at::Tensor>& idx, F&& body) {
  if (idx[0].scalar_type() == at::kInt) {
    body(ranks_of<int32_t>(idx));
  } else {
    body(ranks_of<int64_t>(idx));
  }
}

// Returns (bev (B, C, Z, Y, X), all indices valid). `out`: a contiguous (B, C, Z, Y, X) tensor of
// feat's dtype to write into (ONNX Runtime's output buffer), or None.
std::tuple<at::Tensor, bool> forward(const at::Tensor& depth_, const at::Tensor& feat_,
                                     const at::Tensor& ranks_depth, const at::Tensor& ranks_feat,
                                     const at::Tensor& ranks_bev, std::vector<int64_t> shape,
                                     const at::Tensor& starts, const at::Tensor& lengths,
                                     std::optional<at::Tensor> out_) {
  const at::Tensor depth = depth_.contiguous(), feat = feat_.contiguous();
  const auto idx = index_tensors({ranks_depth, ranks_feat, ranks_bev, starts, lengths});
  TORCH_CHECK(shape.size() == 5, "bev_pool_v2: bev_feat_shape must have 5 entries");
  const int64_t B = shape[0], Z = shape[1], Y = shape[2], X = shape[3], C = shape[4];
  at::Tensor rows = at::zeros({B, Z * Y * X, C}, feat.options());  // one row per BEV cell
  at::Tensor out = out_.has_value() ? *out_ : at::empty({B, C, Z, Y, X}, feat.options());
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == feat.scalar_type() &&
                  out.sizes() == at::IntArrayRef({B, C, Z, Y, X}),
              "bev_pool_v2: out must be a contiguous (B, C, Z, Y, X) tensor of feat's dtype");
  const Sizes s = sizes_of(depth, feat, idx, B * Z * Y * X);
  std::atomic<bool> bad{false};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, feat.scalar_type(), "bev_pool_v2", [&] {
    with_index_type(idx, [&](auto r) {
      forward_kernel<scalar_t>(depth.data_ptr<scalar_t>(), feat.data_ptr<scalar_t>(), r, s,
                               rows.data_ptr<scalar_t>(), bad);
    });
    transpose_cells<false>(out.data_ptr<scalar_t>(), rows.data_ptr<scalar_t>(), B, C, Z * Y * X);
  });
  return {out, !bad};
}

// Returns (grad_depth, grad_feat, all indices valid).
std::tuple<at::Tensor, at::Tensor, bool> backward(const at::Tensor& grad_, const at::Tensor& depth_,
                                                  const at::Tensor& feat_,
                                                  const at::Tensor& ranks_depth,
                                                  const at::Tensor& ranks_feat,
                                                  const at::Tensor& ranks_bev,
                                                  const at::Tensor& starts,
                                                  const at::Tensor& lengths) {
  const at::Tensor depth = depth_.contiguous(), feat = feat_.contiguous();
  const auto idx = index_tensors({ranks_depth, ranks_feat, ranks_bev, starts, lengths});
  at::Tensor grad_cf = grad_.to(feat.scalar_type()).contiguous();  // (B, C, Z, Y, X)
  const int64_t B = grad_cf.size(0), C = grad_cf.size(1), cells = grad_cf.numel() / std::max<int64_t>(B * C, 1);
  at::Tensor grad = at::empty({B, cells, C}, grad_cf.options());  // one row per BEV cell
  const Sizes s = sizes_of(depth, feat, idx, B * cells);
  const auto acc_dtype = at::toOpMathType(feat.scalar_type());
  at::Tensor grad_depth = at::zeros(depth.sizes(), depth.options().dtype(acc_dtype));
  at::Tensor grad_feat = at::zeros(feat.sizes(), feat.options().dtype(acc_dtype));
  std::atomic<bool> bad{false};
  if (s.channels > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, feat.scalar_type(), "bev_pool_v2_backward", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      transpose_cells<true>(grad_cf.data_ptr<scalar_t>(), grad.data_ptr<scalar_t>(), B, C, cells);
      with_index_type(idx, [&](auto r) {
        backward_kernel<scalar_t>(depth.data_ptr<scalar_t>(), feat.data_ptr<scalar_t>(),
                                  grad.data_ptr<scalar_t>(), r, s, grad_depth.data_ptr<acc_t>(),
                                  grad_feat.data_ptr<acc_t>(), bad);
      });
    });
  }
  return {grad_depth.to(depth.scalar_type()), grad_feat.to(feat.scalar_type()), !bad};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "bev_pool_v2 forward (CPU): (bev, indices valid)");
  m.def("backward", &backward, "bev_pool_v2 backward (CPU): (grad_depth, grad_feat, indices valid)");
}
