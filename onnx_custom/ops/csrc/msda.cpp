// multi_scale_deformable_attn (mmcv's MultiScaleDeformableAttnFunction semantics) for CPU.
//
// For every (batch b, query q, head h): output[b, q, h*D:(h+1)*D] = sum over levels l and points
// p of attention_weights[b, q, h, l, p] * bilinear(value level l of head h, at sampling location
// (x, y) = (loc_x * W_l - 0.5, loc_y * H_l - 0.5)), zero outside the level: exactly
// grid_sample(align_corners=False, padding_mode="zeros") on grid 2 * loc - 1. A sample at
// x < -1, x > W, y < -1, y > H or with a non-finite coordinate contributes 0 and gets zero
// gradients (every corner of it lies outside; the check also keeps floor() of huge values or NaN
// from overflowing int64). On the lines x = -1 / x = W the value is 0 but the derivative, as
// grid_sample's, is that of the inside corners.
//
// Validation (shapes, dtypes, the spatial_shapes / level_start_index / num_keys contract) lives in
// Python (onnx_custom/ops/msda.py); this file trusts its inputs. Any strides are accepted: the
// float tensors are converted to dense copies in the compute dtype (float32 for float16 and
// bfloat16, else their own) and results are rounded once at the end.
//
// value (bs, K, M, D) stores each (key, head) as D contiguous numbers, so every bilinear corner is
// one contiguous D-vector: the inner loops are plain axpy / dot over D, which the compiler
// vectorizes. The forward is parallel over (b, q); the backward over (batch, block of heads)
// items, query by query within an item, whose value gradients never overlap (split further by
// queries with private buffers, summed in a fixed order, when there are fewer (b, h) pairs than
// threads), so results never depend on thread timing. No output is zero-filled up front: the
// forward writes each output row once, the backward writes every location / weight gradient and
// each item zeroes its own value-gradient rows.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

inline at::ScalarType compute_type(at::ScalarType t) {
  return (t == at::kHalf || t == at::kBFloat16) ? at::kFloat : t;
}

struct Geometry {
  int64_t bs, K, M, D, Q, L, P;
  std::vector<int64_t> H, W, start;
};

Geometry make_geometry(const at::Tensor& value, const at::Tensor& shapes, const at::Tensor& starts,
                       const at::Tensor& loc) {
  Geometry g;
  g.bs = value.size(0); g.K = value.size(1); g.M = value.size(2); g.D = value.size(3);
  g.Q = loc.size(1); g.L = loc.size(3); g.P = loc.size(4);
  const at::Tensor s = shapes.to(at::kLong).contiguous(), st = starts.to(at::kLong).contiguous();
  const int64_t* sp = s.data_ptr<int64_t>();
  const int64_t* stp = st.data_ptr<int64_t>();
  for (int64_t l = 0; l < g.L; ++l) {
    g.H.push_back(sp[2 * l]);
    g.W.push_back(sp[2 * l + 1]);
    g.start.push_back(stp[l]);
  }
  return g;
}

// One sample's cell: corner (dy, dx) is value row `row + (dy * W + dx)` when `in[2*dy+dx]`.
template <typename T>
struct Cell {
  int64_t row;
  T lx, ly;
  bool in[4];
};

// False when the sample is outside [-1, W] x [-1, H] (or not finite): it then contributes nothing.
template <typename T>
inline bool sample_cell(T loc_x, T loc_y, int64_t H, int64_t W, int64_t start, Cell<T>* c) {
  const T x = loc_x * static_cast<T>(W) - T(0.5), y = loc_y * static_cast<T>(H) - T(0.5);
  if (!(x >= T(-1) && x <= static_cast<T>(W) && y >= T(-1) && y <= static_cast<T>(H))) return false;
  const int64_t x0 = static_cast<int64_t>(std::floor(x)), y0 = static_cast<int64_t>(std::floor(y));
  c->lx = x - static_cast<T>(x0);
  c->ly = y - static_cast<T>(y0);
  c->row = start + y0 * W + x0;
  const bool x0_in = x0 >= 0 && x0 < W, x1_in = x0 + 1 >= 0 && x0 + 1 < W;
  const bool y0_in = y0 >= 0 && y0 < H, y1_in = y0 + 1 >= 0 && y0 + 1 < H;
  c->in[0] = y0_in && x0_in;
  c->in[1] = y0_in && x1_in;
  c->in[2] = y1_in && x0_in;
  c->in[3] = y1_in && x1_in;
  return c->in[0] || c->in[1] || c->in[2] || c->in[3];
}

template <typename T>
inline int64_t corner_row(const Cell<T>& c, int corner, int64_t W) {
  return c.row + (corner >> 1) * W + (corner & 1);
}

template <typename T>
inline void corner_weights(const Cell<T>& c, T* w) {
  const T hx = T(1) - c.lx, hy = T(1) - c.ly;
  w[0] = hy * hx; w[1] = hy * c.lx; w[2] = c.ly * hx; w[3] = c.ly * c.lx;
}

// Head dims are processed in chunks of kChunk numbers with a compile-time width, so the
// accumulator (forward) and the output gradient (backward) of a chunk stay in registers across
// all the samples of a (query, head); the remainder (D % kChunk) takes a runtime-width pass.
constexpr int64_t kChunk = 32;

// One bilinear corner with a non-zero contribution: its value row and its weight.
template <typename T>
struct Tap {
  const T* v;
  T w;
};

template <typename T, int64_t N>
inline void gather_chunk(const Tap<T>* taps, int64_t n, int64_t d0, T* __restrict out) {
  T acc[N] = {};
  for (int64_t t = 0; t < n; ++t) {
    const T* __restrict v = taps[t].v + d0;
    const T w = taps[t].w;
    for (int64_t d = 0; d < N; ++d) acc[d] += w * v[d];
  }
  for (int64_t d = 0; d < N; ++d) out[d0 + d] = acc[d];
}

template <typename T>
inline void gather_rest(const Tap<T>* taps, int64_t n, int64_t d0, int64_t d1, T* __restrict out) {
  for (int64_t d = d0; d < d1; ++d) out[d] = T(0);
  for (int64_t t = 0; t < n; ++t) {
    const T* __restrict v = taps[t].v;
    const T w = taps[t].w;
    for (int64_t d = d0; d < d1; ++d) out[d] += w * v[d];
  }
}

// Output rows [begin, end) of (b * Q + q): each (query, head) first lists its taps (every in-range
// corner of every sample with its attention x bilinear weight), then sums them chunk by chunk and
// writes the result once (the output needs no zero-fill).
template <typename T>
void forward_rows(const Geometry& g, const T* value, const T* loc, const T* attn, T* out,
                  int64_t begin, int64_t end) {
  const int64_t key_stride = g.M * g.D;  // between consecutive keys of one head
  std::vector<Tap<T>> taps(4 * g.L * g.P);
  for (int64_t bq = begin; bq < end; ++bq) {
    const int64_t b = bq / g.Q;
    const T* vb = value + b * g.K * key_stride;
    for (int64_t h = 0; h < g.M; ++h) {
      T* row_out = out + bq * key_stride + h * g.D;
      const T* vh = vb + h * g.D;
      const int64_t sample0 = (bq * g.M + h) * g.L * g.P;
      int64_t n = 0;
      for (int64_t l = 0; l < g.L; ++l) {
        for (int64_t p = 0; p < g.P; ++p) {
          const int64_t s = sample0 + l * g.P + p;
          Cell<T> c;
          if (!sample_cell(loc[2 * s], loc[2 * s + 1], g.H[l], g.W[l], g.start[l], &c)) continue;
          T w[4];
          corner_weights(c, w);
          const T a = attn[s];
          for (int corner = 0; corner < 4; ++corner) {
            if (c.in[corner]) taps[n++] = {vh + corner_row(c, corner, g.W[l]) * key_stride, a * w[corner]};
          }
        }
      }
      int64_t d0 = 0;
      for (; d0 + kChunk <= g.D; d0 += kChunk) gather_chunk<T, kChunk>(taps.data(), n, d0, row_out);
      if (d0 < g.D) gather_rest(taps.data(), n, d0, g.D, row_out);
    }
  }
}

// The samples of one (query, head) that contribute, with what the backward needs of each.
template <typename T>
struct Sample {
  int64_t s;      // index into sampling_locations / attention_weights (without the x/y dim)
  int64_t l;      // level
  Cell<T> c;
  T w[4];         // bilinear corner weights
  const T* v[4];  // corner value rows (nullptr: outside the level)
  T* gv[4];       // their value-gradient rows
  T dot[4];       // grad_output . corner value, accumulated over the D chunks
};

// One chunk of the dims [d0, d0 + n) for every sample: dot products with the corner values and
// the value-gradient scatter (attention x bilinear weight x grad_output).
template <typename T, int64_t N>
inline void backward_chunk(Sample<T>* samples, int64_t count, const T* attn, const T* go_row,
                           int64_t d0, int64_t n_dyn) {
  const int64_t n = N > 0 ? N : n_dyn;
  T go[N > 0 ? N : 1];
  const T* __restrict gsrc = go_row + d0;
  if constexpr (N > 0) {
    for (int64_t d = 0; d < N; ++d) go[d] = gsrc[d];
  }
  for (int64_t i = 0; i < count; ++i) {
    Sample<T>& sm = samples[i];
    const T a = attn[sm.s];
    for (int corner = 0; corner < 4; ++corner) {
      if (sm.v[corner] == nullptr) continue;
      const T* __restrict v = sm.v[corner] + d0;
      T* __restrict gvr = sm.gv[corner] + d0;
      const T aw = a * sm.w[corner];
      T sum = T(0);
      if constexpr (N > 0) {
        // A reduction: without the pragma the compiler keeps it scalar (it may not reorder float
        // additions on its own). N is fixed, so the order is too: results are reproducible.
#pragma omp simd reduction(+ : sum)
        for (int64_t d = 0; d < N; ++d) {
          sum += go[d] * v[d];
          gvr[d] += aw * go[d];
        }
      } else {
#pragma omp simd reduction(+ : sum)
        for (int64_t d = 0; d < n; ++d) {
          sum += gsrc[d] * v[d];
          gvr[d] += aw * gsrc[d];
        }
      }
      sm.dot[corner] += sum;
    }
  }
}

// Gradients of the queries [q0, q1) of heads [h0, h1) in batch b, query by query (all of a
// query's heads together: the rows they touch are neighbours in value's (key, head, dim) layout,
// ~1.4x faster than head by head). The value gradient of key k, head h goes to
// gv[k * gv_stride + (h - h0) * gv_head : + D]; every sampling-location and attention-weight
// gradient of these queries is written (zeros for samples that contribute nothing), so neither
// needs a zero-fill.
template <typename T>
void backward_query(const Geometry& g, int64_t b, int64_t h, int64_t q, const T* value,
                    const T* loc, const T* attn, const T* grad, T* gv, int64_t gv_stride, T* gloc,
                    T* gattn, std::vector<Sample<T>>& samples);

template <typename T>
void backward_block(const Geometry& g, int64_t b, int64_t h0, int64_t h1, int64_t q0, int64_t q1,
                    const T* value, const T* loc, const T* attn, const T* grad, T* gv,
                    int64_t gv_stride, int64_t gv_head, T* gloc, T* gattn,
                    std::vector<Sample<T>>& samples) {
  samples.resize(g.L * g.P);
  for (int64_t q = q0; q < q1; ++q) {
    for (int64_t h = h0; h < h1; ++h) {
      backward_query(g, b, h, q, value, loc, attn, grad, gv + (h - h0) * gv_head, gv_stride, gloc,
                     gattn, samples);
    }
  }
}

// Gradients of query q of head h in batch b (see backward_block).
template <typename T>
void backward_query(const Geometry& g, int64_t b, int64_t h, int64_t q, const T* value,
                    const T* loc, const T* attn, const T* grad, T* gv, int64_t gv_stride, T* gloc,
                    T* gattn, std::vector<Sample<T>>& samples) {
  const int64_t key_stride = g.M * g.D;
  const T* vh = value + b * g.K * key_stride + h * g.D;
  const int64_t bq = b * g.Q + q;
  const T* go = grad + bq * key_stride + h * g.D;
  const int64_t sample0 = (bq * g.M + h) * g.L * g.P;
  int64_t count = 0;
  for (int64_t l = 0; l < g.L; ++l) {
    for (int64_t p = 0; p < g.P; ++p) {
      const int64_t s = sample0 + l * g.P + p;
      Sample<T>& sm = samples[count];
      if (!sample_cell(loc[2 * s], loc[2 * s + 1], g.H[l], g.W[l], g.start[l], &sm.c)) {
        gattn[s] = T(0);
        gloc[2 * s] = gloc[2 * s + 1] = T(0);
        continue;
      }
      sm.s = s;
      sm.l = l;
      corner_weights(sm.c, sm.w);
      for (int corner = 0; corner < 4; ++corner) {
        const int64_t row = corner_row(sm.c, corner, g.W[l]);
        sm.v[corner] = sm.c.in[corner] ? vh + row * key_stride : nullptr;
        sm.gv[corner] = sm.c.in[corner] ? gv + row * gv_stride : nullptr;
        sm.dot[corner] = T(0);
      }
      ++count;
    }
  }
  int64_t d0 = 0;
  for (; d0 + kChunk <= g.D; d0 += kChunk) backward_chunk<T, kChunk>(samples.data(), count, attn, go, d0, 0);
  if (d0 < g.D) backward_chunk<T, 0>(samples.data(), count, attn, go, d0, g.D - d0);
  for (int64_t i = 0; i < count; ++i) {
    const Sample<T>& sm = samples[i];
    const T* dot = sm.dot;
    const T* w = sm.w;
    const T a = attn[sm.s];
    gattn[sm.s] = w[0] * dot[0] + w[1] * dot[1] + w[2] * dot[2] + w[3] * dot[3];
    const T hx = T(1) - sm.c.lx, hy = T(1) - sm.c.ly;
    const T dx = hy * (dot[1] - dot[0]) + sm.c.ly * (dot[3] - dot[2]);
    const T dy = hx * (dot[2] - dot[0]) + sm.c.lx * (dot[3] - dot[1]);
    gloc[2 * sm.s] = a * static_cast<T>(g.W[sm.l]) * dx;
    gloc[2 * sm.s + 1] = a * static_cast<T>(g.H[sm.l]) * dy;
  }
}

// Zero the value-gradient rows of one work item: `rows` rows of D numbers, gv_stride apart. Done by
// the thread that then accumulates into them (first touch, parallel, cache-warm).
template <typename T>
void zero_rows(T* gv, int64_t rows, int64_t D, int64_t gv_stride) {
  if (gv_stride == D) {
    std::fill(gv, gv + rows * D, T(0));
    return;
  }
  for (int64_t k = 0; k < rows; ++k) std::fill(gv + k * gv_stride, gv + k * gv_stride + D, T(0));
}

at::Tensor forward(const at::Tensor& value_, const at::Tensor& spatial_shapes,
                   const at::Tensor& level_start_index, const at::Tensor& loc_,
                   const at::Tensor& attn_, int64_t /*im2col_step: a CUDA batching hint*/) {
  const at::ScalarType ct = compute_type(value_.scalar_type());
  const at::Tensor value = value_.to(ct).contiguous(), loc = loc_.to(ct).contiguous(),
                   attn = attn_.to(ct).contiguous();
  const Geometry g = make_geometry(value, spatial_shapes, level_start_index, loc);
  at::Tensor out = at::empty({g.bs, g.Q, g.M * g.D}, value.options());  // every number is written
  if (out.numel() == 0) return out.to(value_.scalar_type());
  AT_DISPATCH_FLOATING_TYPES(ct, "multi_scale_deformable_attn", [&] {
    const scalar_t* v = value.data_ptr<scalar_t>();
    const scalar_t* lp = loc.data_ptr<scalar_t>();
    const scalar_t* ap = attn.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, g.bs * g.Q, 16, [&](int64_t begin, int64_t end) {
      forward_rows(g, v, lp, ap, op, begin, end);
    });
  });
  return out.to(value_.scalar_type());
}

std::vector<at::Tensor> backward(const at::Tensor& grad_, const at::Tensor& value_,
                                 const at::Tensor& spatial_shapes,
                                 const at::Tensor& level_start_index, const at::Tensor& loc_,
                                 const at::Tensor& attn_, int64_t /*im2col_step*/) {
  const at::ScalarType ct = compute_type(value_.scalar_type());
  const at::Tensor value = value_.to(ct).contiguous(), loc = loc_.to(ct).contiguous(),
                   attn = attn_.to(ct).contiguous(), grad = grad_.to(ct).contiguous();
  const Geometry g = make_geometry(value, spatial_shapes, level_start_index, loc);
  // No zero-fills here: the workers zero their own value-gradient rows and write every
  // location / weight gradient.
  at::Tensor grad_value = at::empty(value.sizes(), value.options());
  at::Tensor grad_loc = at::empty(loc.sizes(), value.options());
  at::Tensor grad_attn = at::empty(attn.sizes(), value.options());
  const auto result = [&]() -> std::vector<at::Tensor> {
    return {grad_value.to(value_.scalar_type()), grad_loc.to(loc_.scalar_type()),
            grad_attn.to(attn_.scalar_type())};
  };
  if (g.bs * g.Q * g.M * g.L * g.P == 0 || g.D == 0) {
    grad_value.zero_();
    grad_loc.zero_();
    grad_attn.zero_();
    return result();
  }
  const int64_t pairs = g.bs * g.M, threads = at::get_num_threads();
  // Work items own disjoint value gradients, so no two threads ever add into the same number:
  // (batch, block of heads) items, as many blocks per batch as it takes to feed the threads.
  // Fewer (b, h) pairs than threads: split each pair's queries instead, each split with its own
  // value gradient buffer (K x D), summed afterwards in split order. Results never depend on
  // thread timing.
  const int64_t splits = pairs >= threads ? 1 : std::min<int64_t>(g.Q, (threads + pairs - 1) / pairs);
  const int64_t blocks = splits > 1 ? g.M : std::min<int64_t>(g.M, (threads + g.bs - 1) / g.bs);
  const int64_t items = g.bs * blocks * splits;
  std::vector<at::Tensor> privates(splits > 1 ? items : 0);
  if (splits > 1) grad_value.zero_();
  AT_DISPATCH_FLOATING_TYPES(ct, "multi_scale_deformable_attn_backward", [&] {
    using T = scalar_t;
    const T* v = value.data_ptr<T>();
    const T* lp = loc.data_ptr<T>();
    const T* ap = attn.data_ptr<T>();
    const T* gp = grad.data_ptr<T>();
    T* gvp = grad_value.data_ptr<T>();
    T* glp = grad_loc.data_ptr<T>();
    T* gap = grad_attn.data_ptr<T>();
    at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
      std::vector<Sample<T>> samples;
      for (int64_t item = begin; item < end; ++item) {
        const int64_t block = item / splits, split = item % splits;
        const int64_t b = block / blocks, blk = block % blocks;
        const int64_t h0 = blk * g.M / blocks, h1 = (blk + 1) * g.M / blocks;
        const int64_t q0 = split * g.Q / splits, q1 = (split + 1) * g.Q / splits;
        if (splits == 1) {
          T* gv = gvp + b * g.K * g.M * g.D + h0 * g.D;
          zero_rows(gv, g.K, (h1 - h0) * g.D, g.M * g.D);
          backward_block(g, b, h0, h1, q0, q1, v, lp, ap, gp, gv, g.M * g.D, g.D, glp, gap, samples);
        } else {  // one head per block
          privates[item] = at::zeros({g.K, g.D}, value.options());
          backward_block(g, b, h0, h1, q0, q1, v, lp, ap, gp, privates[item].data_ptr<T>(), g.D,
                         int64_t(0), glp, gap, samples);
        }
      }
    });
  });
  if (splits > 1) {
    for (int64_t item = 0; item < items; ++item) {
      const int64_t pair = item / splits;  // blocks == M: block = pair = b * M + h
      grad_value.select(0, pair / g.M).select(1, pair % g.M).add_(privates[item]);
    }
  }
  return result();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "multi_scale_deformable_attn forward (CPU)");
  m.def("backward", &backward,
        "multi_scale_deformable_attn backward (CPU): value, sampling_locations, attention_weights");
}
