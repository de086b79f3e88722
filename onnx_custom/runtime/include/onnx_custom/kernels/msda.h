// multi_scale_deformable_attn's bilinear sample, shared by the eager op
// (onnx_custom/ops/csrc/msda.cpp: forward, backward) and the native ORT kernel
// (ort_kernels/native/msda.cpp), both including it as "onnx_custom/kernels/msda.h": one definition
// of where a sampling location lands, which corners are inside the level and their weights. It
// lives in the runtime layer's include folder, below both of its users in the layer order. The
// eager op's float32 AVX2 backward setup (prepare_fast) computes the same cell 8 samples at a time.
//
// The sample at (loc_x, loc_y) in [0, 1]^2 of an H x W level is grid_sample(align_corners=False,
// padding_mode="zeros") on grid 2 * loc - 1: the point (x, y) = (loc_x * W - 0.5, loc_y * H - 0.5),
// its cell's top-left corner (floor(x), floor(y)), the fractional parts, and the four corners
// (top-left, top-right, bottom-left, bottom-right) with zero padding outside the level.
//
// Plain C++17; no torch, no ONNX Runtime. Everything sits in an anonymous namespace so neither
// library exports (or picks up the other's) copies when both are loaded in one process.
#pragma once

#include <cmath>
#include <cstdint>

namespace onnx_custom_msda_math {
namespace {

// One sample's cell: corner c (0..3; dy = c >> 1, dx = c & 1) is key `row + dy * W + dx` of the
// value tensor when `in[c]`.
template <typename T>
struct Cell {
  int64_t row;
  T lx, ly;
  bool in[4];
};

// The cell of the sample at (loc_x, loc_y) on a level of H x W keys starting at key `start`.
// False when the sample contributes nothing: outside [-1, W] x [-1, H], not finite (the ordered
// comparisons are false for NaN, and floor() of a huge or NaN value never reaches the integer
// cast), or with no corner inside the level.
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

// The key of corner `corner` of a cell on a level W keys wide.
template <typename T>
inline int64_t corner_row(const Cell<T>& c, int corner, int64_t W) {
  return c.row + (corner >> 1) * W + (corner & 1);
}

// The four corners' bilinear weights (they sum to 1; a corner outside the level still gets its
// weight: the caller skips it).
template <typename T>
inline void corner_weights(const Cell<T>& c, T* w) {
  const T hx = T(1) - c.lx, hy = T(1) - c.ly;
  w[0] = hy * hx;
  w[1] = hy * c.lx;
  w[2] = c.ly * hx;
  w[3] = c.ly * c.lx;
}

}  // namespace
}  // namespace onnx_custom_msda_math
