// bev_pool_v2 (BEVDet voxel pooling) for CPU: gather, multiply and accumulate fused per interval,
// so no (points x channels) temporary is ever made. Shapes and dtypes are checked in Python
// (shared with the fake kernel); index values are checked here, inline: an out-of-range index is
// skipped and reported through the returned flag, and Python then raises the detailed error.
//
// Accumulation: in at::opmath_type (float for float, float16 and bfloat16; double for double),
// point by point in index order (the backward per chunk of intervals, see backward_kernel).
#include <torch/extension.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

// GCC and clang on x86-64 compile the float32 AVX-512 backward (target attributes) whatever -m
// flags the build uses; it runs only where the CPU has AVX-512F (checked at run time).
#if defined(__GNUC__) && defined(__x86_64__)
#define ONNX_CUSTOM_BEV_AVX512 1
#include <immintrin.h>
#endif

namespace {

// Tests turn the AVX-512 backward off to run the portable path on AVX-512 machines too.
bool avx512_disabled = false;

bool use_avx512() {
#ifdef ONNX_CUSTOM_BEV_AVX512
  static const bool supported = __builtin_cpu_supports("avx512f");
  return supported && !avx512_disabled;
#else
  return false;
#endif
}

struct Sizes {
  int64_t points, intervals, channels, depth_numel, feat_rows, cells;
};

// One row of C channels per cell (B, S, C) -> channels-first (B, C, S), S = Z*Y*X: the forward
// accumulates rows, the op's output is channels-first. ATen's permute + contiguous is slow for
// 128x128x80 floats (it walks 64 KiB-strided columns). Tiles of 16 channels x 1024 cells
// write 4 KiB runs and read the tile's row lines (64 KiB, cached) 16 times.
template <typename T>
void rows_to_channels_first(T* channels_first, const T* rows, int64_t B, int64_t C, int64_t S) {
  constexpr int64_t kChannels = 16, kCells = 1024;
  const int64_t ctiles = (C + kChannels - 1) / kChannels, stiles = (S + kCells - 1) / kCells;
  at::parallel_for(0, B * stiles * ctiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / (stiles * ctiles), st = (t / ctiles) % stiles, ct = t % ctiles;
      const int64_t s0 = st * kCells, s1 = std::min(S, s0 + kCells);
      const int64_t c0 = ct * kChannels, c1 = std::min(C, c0 + kChannels);
      T* cf = channels_first + b * C * S;
      const T* rw = rows + b * S * C;
      for (int64_t c = c0; c < c1; ++c) {
        for (int64_t j = s0; j < s1; ++j) cf[c * S + j] = rw[j * C + c];
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

// The sum of a vector's lanes as a tree: halves first (one 16-byte add), then the last lanes.
template <typename acc_t>
inline acc_t sum_lanes(const typename Vec<acc_t>::type& v) {
  typedef acc_t half __attribute__((vector_size(16)));
  half lo, hi;
  std::memcpy(&lo, &v, sizeof(lo));
  std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof(lo), sizeof(hi));
  lo += hi;
  acc_t sum = 0;
  for (int64_t j = 0; j < int64_t(sizeof(half) / sizeof(acc_t)); ++j) sum += lo[j];
  return sum;
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

// What one backward chunk reads and writes (see backward_chunk).
template <typename scalar_t, typename index_t>
struct Chunk {
  using acc_t = at::opmath_type<scalar_t>;
  const scalar_t* depth;
  const scalar_t* feat;
  const Ranks<index_t>& r;
  const Sizes& s;
  acc_t* grad_depth;
  acc_t* grad_feat;
  std::atomic<bool>& bad;
};

// A batch of a chunk's valid points in interval order, gathered in one sequential pass before the
// row work: feature row, depth index and depth value per point, and the dot the row pass computes
// for it; per non-empty interval its cell and where its points end. The row pass then reads
// these arrays in order, with no index checks and no random depth reads, and grad_depth is
// scattered once per batch: 0.69-0.76x the kernel that did all of it per point (paired,
// standalone harness, CPU time, 1 thread, load ~7). Batches of ~kBatch points keep the arrays
// in L2 between the passes and their memory bounded whatever the intervals (they may overlap).
template <typename acc_t, typename index_t>
struct Gathered {
  std::vector<index_t> feat, depth;
  std::vector<acc_t> weight, dot;
  std::vector<int64_t> cell, end;
  int64_t count = 0;  // points in this batch (the vectors may be longer)
};

constexpr int64_t kBatch = 16384;

// Gathers intervals k0, k0 + 1, ... (before k1) until the batch holds ~kBatch points (at least
// one interval); returns the first interval not taken.
template <typename scalar_t, typename index_t>
int64_t gather_batch(const Chunk<scalar_t, index_t>& ch, int64_t k0, int64_t k1,
                     Gathered<at::opmath_type<scalar_t>, index_t>& p) {
  using acc_t = at::opmath_type<scalar_t>;
  p.cell.clear();
  p.end.clear();
  int64_t m = 0, k = k0;
  for (; k < k1; ++k) {
    int64_t begin, end, cell;
    if (!interval(ch.r, ch.s, k, &begin, &end, &cell, ch.bad)) continue;
    if (m > 0 && m + (end - begin) > kBatch) break;
    const size_t need = static_cast<size_t>(m + (end - begin));
    if (p.feat.size() < need) {
      const size_t size = std::max(need, static_cast<size_t>(kBatch));
      p.feat.resize(size);
      p.depth.resize(size);
      p.weight.resize(size);
      p.dot.resize(size);
    }
    for (int64_t i = begin; i < end; ++i) {
      int64_t d, f;
      if (!point(ch.r, ch.s, i, &d, &f, ch.bad)) continue;
      p.feat[m] = static_cast<index_t>(f);
      p.depth[m] = static_cast<index_t>(d);
      p.weight[m] = static_cast<acc_t>(ch.depth[d]);
      ++m;
    }
    p.cell.push_back(cell);
    p.end.push_back(m);
  }
  p.count = m;
  return k;
}

// Random rows in L2/L3: ask for the rows of the point kAhead places on early (across intervals).
constexpr int64_t kAhead = 4;

template <typename scalar_t, typename index_t>
inline void prefetch_rows(const Chunk<scalar_t, index_t>& ch, int64_t f) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t C = ch.s.channels;
  for (int64_t c = 0; c < C; c += 64 / sizeof(acc_t)) {
    __builtin_prefetch(ch.grad_feat + f * C + c, 1);
    __builtin_prefetch(ch.feat + f * C + c);
  }
}

// Gathered points [e0, e1) of one interval against its grad row g: dot[e] = dot(g, feat[f]) and
// grad_feat[f] += weight[e] * g.
template <typename scalar_t, typename index_t>
void interval_rows(const Chunk<scalar_t, index_t>& ch, const at::opmath_type<scalar_t>* g,
                   Gathered<at::opmath_type<scalar_t>, index_t>& p, int64_t e0, int64_t e1) {
  using acc_t = at::opmath_type<scalar_t>;
  using vec = typename Vec<acc_t>::type;
  constexpr int64_t L = Vec<acc_t>::lanes;
  const int64_t C = ch.s.channels, n = p.count;
  for (int64_t e = e0; e < e1; ++e) {
    if (e + kAhead < n) prefetch_rows(ch, p.feat[e + kAhead]);
    const acc_t w = p.weight[e];
    const scalar_t* row = ch.feat + p.feat[e] * C;
    acc_t* out = ch.grad_feat + p.feat[e] * C;
    vec dot0 = {}, dot1 = {};  // two chains: FMA latency, not throughput, bounds one chain
    int64_t c = 0;
    for (; c + 2 * L <= C; c += 2 * L) {
      const vec g0 = load_vec<acc_t>(g + c), g1 = load_vec<acc_t>(g + c + L);
      dot0 += g0 * load_vec<acc_t>(row + c);
      dot1 += g1 * load_vec<acc_t>(row + c + L);
      store_vec<acc_t>(out + c, load_vec<acc_t>(out + c) + w * g0);
      store_vec<acc_t>(out + c + L, load_vec<acc_t>(out + c + L) + w * g1);
    }
    for (; c + L <= C; c += L) {
      const vec g0 = load_vec<acc_t>(g + c);
      dot0 += g0 * load_vec<acc_t>(row + c);
      store_vec<acc_t>(out + c, load_vec<acc_t>(out + c) + w * g0);
    }
    acc_t dot = sum_lanes<acc_t>(dot0 + dot1);
    for (; c < C; ++c) {
      dot += g[c] * static_cast<acc_t>(row[c]);
      out[c] += w * g[c];
    }
    p.dot[e] = dot;
  }
}

// Cells [j0, j0 + n) of one batch item of the channels-first grad (cells S apart per channel) as
// rows of C channels: tile[j * C + c] = src[c * S + j].
template <typename scalar_t, typename acc_t>
void load_tile(const scalar_t* src, int64_t S, int64_t n, int64_t C, acc_t* tile) {
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t j = 0; j < n; ++j) tile[j * C + c] = static_cast<acc_t>(src[c * S + j]);
  }
}

#ifdef ONNX_CUSTOM_BEV_AVX512
// float32 with AVX-512F: interval_rows with channel blocks of 16 (the partial dots go to two
// chains, even and odd blocks, the masked tail block to the odd one): 5 zmm rows for C = 80
// instead of 10 ymm.
template <typename index_t>
__attribute__((target("avx512f"))) void interval_rows_avx512(const Chunk<float, index_t>& ch,
                                                             const float* g,
                                                             Gathered<float, index_t>& p,
                                                             int64_t e0, int64_t e1) {
  const int64_t C = ch.s.channels, blocks = C / 16, n = p.count;
  const __mmask16 tail = static_cast<__mmask16>((1u << (C % 16)) - 1);
  for (int64_t e = e0; e < e1; ++e) {
    if (e + kAhead < n) prefetch_rows(ch, p.feat[e + kAhead]);
    const __m512 w = _mm512_set1_ps(p.weight[e]);
    const float* row = ch.feat + p.feat[e] * C;
    float* out = ch.grad_feat + p.feat[e] * C;
    __m512 dot0 = _mm512_setzero_ps(), dot1 = _mm512_setzero_ps();
    int64_t c = 0, b = 0;
    for (; b + 2 <= blocks; b += 2, c += 32) {
      const __m512 g0 = _mm512_loadu_ps(g + c), g1 = _mm512_loadu_ps(g + c + 16);
      dot0 = _mm512_fmadd_ps(g0, _mm512_loadu_ps(row + c), dot0);
      dot1 = _mm512_fmadd_ps(g1, _mm512_loadu_ps(row + c + 16), dot1);
      _mm512_storeu_ps(out + c, _mm512_fmadd_ps(w, g0, _mm512_loadu_ps(out + c)));
      _mm512_storeu_ps(out + c + 16, _mm512_fmadd_ps(w, g1, _mm512_loadu_ps(out + c + 16)));
    }
    if (b < blocks) {
      const __m512 g0 = _mm512_loadu_ps(g + c);
      dot0 = _mm512_fmadd_ps(g0, _mm512_loadu_ps(row + c), dot0);
      _mm512_storeu_ps(out + c, _mm512_fmadd_ps(w, g0, _mm512_loadu_ps(out + c)));
      c += 16;
    }
    if (tail) {
      const __m512 g0 = _mm512_maskz_loadu_ps(tail, g + c);
      dot1 = _mm512_fmadd_ps(g0, _mm512_maskz_loadu_ps(tail, row + c), dot1);
      _mm512_mask_storeu_ps(out + c, tail, _mm512_fmadd_ps(w, g0, _mm512_maskz_loadu_ps(tail, out + c)));
    }
    p.dot[e] = _mm512_reduce_add_ps(_mm512_add_ps(dot0, dot1));
  }
}

// load_tile for float32 in 8x8 blocks (8 row loads, 24 shuffles, 8 row stores instead of 64
// scalar loads and stores), the ragged edges scalar: ~4% off the backward kernel.
__attribute__((target("avx512f"))) inline void transpose8x8(const float* src, int64_t S,
                                                            float* dst, int64_t C) {
  __m256 r[8], t[8];
  for (int q = 0; q < 8; ++q) r[q] = _mm256_loadu_ps(src + q * S);
  for (int q = 0; q < 8; q += 2) {
    t[q] = _mm256_unpacklo_ps(r[q], r[q + 1]);
    t[q + 1] = _mm256_unpackhi_ps(r[q], r[q + 1]);
  }
  for (int h = 0; h < 8; h += 4) {  // (0 1 2 3) from t[h..h+3]: 2x2 blocks of pairs
    r[h] = _mm256_shuffle_ps(t[h], t[h + 2], 0x44);
    r[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], 0xEE);
    r[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0x44);
    r[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0xEE);
  }
  for (int q = 0; q < 4; ++q) {
    _mm256_storeu_ps(dst + q * C, _mm256_permute2f128_ps(r[q], r[q + 4], 0x20));
    _mm256_storeu_ps(dst + (q + 4) * C, _mm256_permute2f128_ps(r[q], r[q + 4], 0x31));
  }
}

__attribute__((target("avx512f"))) void load_tile_avx512(const float* src, int64_t S, int64_t n,
                                                         int64_t C, float* tile) {
  const int64_t c8 = C - C % 8, n8 = n - n % 8;
  for (int64_t c = 0; c < c8; c += 8) {
    for (int64_t j = 0; j < n8; j += 8) transpose8x8(src + c * S + j, S, tile + j * C + c, C);
    for (int64_t q = c; q < c + 8; ++q) {
      for (int64_t j = n8; j < n; ++j) tile[j * C + q] = src[q * S + j];
    }
  }
  for (int64_t c = c8; c < C; ++c) {
    for (int64_t j = 0; j < n; ++j) tile[j * C + c] = src[c * S + j];
  }
}
#endif

// Both gradients in one pass over the intervals, walked as the forward walks them: for every valid
// point (d, f) of an interval writing `cell`,
//   grad_depth[d] += dot(grad[cell], feat[f]),   grad_feat[f] += depth[d] * grad[cell].
// The points are gathered first (gather_chunk); the interval's grad row comes from a tile of
// consecutive cells read from the channels-first grad (intervals come sorted by cell, so each tile
// is read once; no transposed copy of grad is made) and stays in L1 while the interval's points
// stream by. Points of different intervals may share a feature row or a depth element, so the
// intervals go in `chunks` contiguous ranges, each accumulating into its own zeroed gradient
// buffers (no atomics, no sort); `reduce_chunks` sums them. (Grouping points
// by feature row with a serial counting sort was slower; so were a feature-major walk over a
// per-call counting sort, the sort alone ~60% of the kernel, and buckets of feature rows that fit
// L2, the bucketing and a transposed grad costing more than the L2 hits saved.) Every buffer
// accumulates in interval order: results depend on the chunk count (so on the thread count for
// large inputs), never on scheduling.
// Grad rows of kTile consecutive cells, transposed from the channels-first grad as a tile: each
// channel's kTile values are 4 whole cache lines. (Gathering one cell's C values at stride S instead
// hits one cache set C times when S is a power of two, 128x128 = 64 KiB apart: much slower.)
// Intervals come sorted by cell, so each tile is loaded once; no transposed copy of grad is made.
template <typename scalar_t>
class GradTiles {
 public:
  using acc_t = at::opmath_type<scalar_t>;
  static constexpr int64_t kTile = 64;

  GradTiles(const scalar_t* grad, int64_t C, int64_t S, bool avx512)
      : grad_(grad), C_(C), S_(S), avx512_(avx512), tile_(static_cast<size_t>(kTile * C)) {}

  // Cell `cell`'s C grad values (valid until the next call).
  const acc_t* row(int64_t cell) {
    if (cell < begin_ || cell >= end_) load(cell);
    return tile_.data() + (cell - begin_) * C_;
  }

 private:
  void load(int64_t cell) {
    const int64_t j0 = cell % S_ - cell % S_ % kTile, n = std::min(kTile, S_ - j0);
    const scalar_t* src = grad_ + (cell / S_) * C_ * S_ + j0;
    const int64_t ahead = std::min(kTile, S_ - j0 - n);  // the next tile, likely needed next
    for (int64_t c = 0; c < C_; ++c) {
      for (int64_t j = 0; j < ahead; j += 64 / sizeof(scalar_t)) __builtin_prefetch(src + c * S_ + n + j);
    }
#ifdef ONNX_CUSTOM_BEV_AVX512
    if constexpr (std::is_same_v<scalar_t, float>) {
      if (avx512_) {
        load_tile_avx512(src, S_, n, C_, tile_.data());
        begin_ = cell - cell % S_ % kTile;
        end_ = begin_ + n;
        return;
      }
    }
#endif
    load_tile(src, S_, n, C_, tile_.data());
    begin_ = cell - cell % S_ % kTile;
    end_ = begin_ + n;
  }

  const scalar_t* grad_;
  int64_t C_, S_;
  bool avx512_;
  std::vector<acc_t> tile_;
  int64_t begin_ = 0, end_ = 0;  // the cells the tile holds
};

// Both gradients in one pass over the intervals, walked as the forward walks them: for every valid
// point (d, f) of an interval writing `cell`,
//   grad_depth[d] += dot(grad[cell], feat[f]),   grad_feat[f] += depth[d] * grad[cell].
// Batch by batch (gather_batch), the interval's grad row (GradTiles) stays in L1 while its points
// stream by. Points of different intervals may share a feature row or a depth element, so the
// intervals go in `chunks` contiguous ranges, each accumulating into its own zeroed gradient
// buffers (no atomics, no sort); `reduce_chunks` sums them. (Grouping points
// by feature row with a serial counting sort was slower; so were a feature-major walk over a
// per-call counting sort, the sort alone ~60% of the kernel, and buckets of feature rows that fit
// L2, the bucketing and a transposed grad costing more than the L2 hits saved.) Every buffer
// accumulates in interval order, whatever the batch size: results depend on the chunk count (so
// on the thread count for large inputs), never on scheduling.
template <typename scalar_t, typename index_t>
void backward_chunk(const Chunk<scalar_t, index_t>& ch, const scalar_t* grad, int64_t cells_per_batch,
                    int64_t k0, int64_t k1, bool avx512) {
  using acc_t = at::opmath_type<scalar_t>;
  std::fill(ch.grad_depth, ch.grad_depth + ch.s.depth_numel, acc_t(0));  // first touch by this thread
  std::fill(ch.grad_feat, ch.grad_feat + ch.s.feat_rows * ch.s.channels, acc_t(0));
  GradTiles<scalar_t> tiles(grad, ch.s.channels, cells_per_batch, avx512);
  Gathered<acc_t, index_t> p;
  for (int64_t k = k0; k < k1;) {
    k = gather_batch(ch, k, k1, p);
    int64_t e0 = 0;
    for (size_t q = 0; q < p.cell.size(); ++q) {
      const acc_t* g = tiles.row(p.cell[q]);
      const int64_t e1 = p.end[q];
#ifdef ONNX_CUSTOM_BEV_AVX512
      if constexpr (std::is_same_v<scalar_t, float>) {
        if (avx512) {
          interval_rows_avx512(ch, g, p, e0, e1);
          e0 = e1;
          continue;
        }
      }
#endif
      interval_rows(ch, g, p, e0, e1);
      e0 = e1;
    }
    for (int64_t e = 0; e < p.count; ++e) ch.grad_depth[p.depth[e]] += p.dot[e];
  }
}

// How many interval ranges the backward splits into: one per thread, fewer for few intervals, and
// at most ~256 MiB of extra gradient buffers (a buffer holds grad_depth and grad_feat in acc_t).
inline int64_t backward_chunks(const Sizes& s, int64_t acc_bytes) {
  constexpr int64_t kMinIntervals = 256, kBudget = int64_t(256) << 20;
  const int64_t buffer = std::max<int64_t>(1, (s.depth_numel + s.feat_rows * s.channels) * acc_bytes);
  const int64_t by_work = std::max<int64_t>(1, s.intervals / kMinIntervals);
  return std::max<int64_t>(1, std::min({int64_t(at::get_num_threads()), by_work, 1 + kBudget / buffer}));
}

// first[j] += sum over t of extra[t][j], for j in [0, n); extra[t] = extra + t * stride.
template <typename acc_t>
void reduce_chunks(acc_t* first, const acc_t* extra, int64_t n, int64_t stride, int64_t count) {
  if (count == 0) return;
  at::parallel_for(0, n, 16384, [&](int64_t j0, int64_t j1) {
    for (int64_t t = 0; t < count; ++t) {
      const acc_t* src = extra + t * stride;
      for (int64_t j = j0; j < j1; ++j) first[j] += src[j];
    }
  });
}

template <typename scalar_t, typename index_t>
void backward_kernel(const scalar_t* depth, const scalar_t* feat, const scalar_t* grad,
                     int64_t cells_per_batch, const Ranks<index_t>& r, const Sizes& s,
                     at::opmath_type<scalar_t>* grad_depth, at::opmath_type<scalar_t>* grad_feat,
                     std::atomic<bool>& bad) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t chunks = backward_chunks(s, sizeof(acc_t));
  const int64_t nd = s.depth_numel, nf = s.feat_rows * s.channels;
  // Chunks 1.. (depth | feat), left uninitialized: each chunk zero-fills its own buffers (first
  // touch by its thread). A std::vector zeroed them all first, serially, on the calling thread.
  const std::unique_ptr<acc_t[]> extra(chunks > 1 ? new acc_t[static_cast<size_t>((chunks - 1) * (nd + nf))] : nullptr);
  const bool avx512 = use_avx512();
  at::parallel_for(0, chunks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t k0 = s.intervals * t / chunks, k1 = s.intervals * (t + 1) / chunks;
      acc_t* gd = t == 0 ? grad_depth : extra.get() + (t - 1) * (nd + nf);
      acc_t* gf = t == 0 ? grad_feat : gd + nd;
      const Chunk<scalar_t, index_t> ch{depth, feat, r, s, gd, gf, bad};
      backward_chunk(ch, grad, cells_per_batch, k0, k1, avx512);
    }
  });
  if (chunks > 1) {
    reduce_chunks(grad_depth, extra.get(), nd, nd + nf, chunks - 1);
    reduce_chunks(grad_feat, extra.get() + nd, nf, nd + nf, chunks - 1);
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
    rows_to_channels_first(out.data_ptr<scalar_t>(), rows.data_ptr<scalar_t>(), B, C, Z * Y * X);
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
  const at::Tensor grad = grad_.to(feat.scalar_type()).contiguous();  // (B, C, Z, Y, X)
  const int64_t B = grad.size(0), C = grad.size(1), cells = grad.numel() / std::max<int64_t>(B * C, 1);
  const Sizes s = sizes_of(depth, feat, idx, B * cells);
  const auto acc_dtype = at::toOpMathType(feat.scalar_type());
  at::Tensor grad_depth = at::empty(depth.sizes(), depth.options().dtype(acc_dtype));
  at::Tensor grad_feat = at::empty(feat.sizes(), feat.options().dtype(acc_dtype));
  std::atomic<bool> bad{false};
  if (s.channels == 0) {  // grad_feat is empty; nothing reaches depth
    grad_depth.zero_();
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, feat.scalar_type(), "bev_pool_v2_backward", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      with_index_type(idx, [&](auto r) {
        backward_kernel<scalar_t>(depth.data_ptr<scalar_t>(), feat.data_ptr<scalar_t>(),
                                  grad.data_ptr<scalar_t>(), cells, r, s,
                                  grad_depth.data_ptr<acc_t>(), grad_feat.data_ptr<acc_t>(), bad);
      });
    });
  }
  return {grad_depth.to(depth.scalar_type()), grad_feat.to(feat.scalar_type()), !bad};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "bev_pool_v2 forward (CPU): (bev, indices valid)");
  m.def("backward", &backward, "bev_pool_v2 backward (CPU): (grad_depth, grad_feat, indices valid)");
  m.def("disable_avx512", [](bool off) { avx512_disabled = off; },
        "tests: run the portable float32 backward (compiler-vectorized rows, scalar tile "
        "transposes) even where the CPU has AVX-512F");
  m.def("avx512", &use_avx512, "whether the float32 backward runs the AVX-512 kernels");
}
