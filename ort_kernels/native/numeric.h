// Element-type dispatch and numpy's scalar semantics for the elementwise kernels (seed.cpp,
// multi_out.cpp): `x * dtype(scale)` with the scale cast to x's dtype first, 16-bit floats
// rounded after every operation (numpy computes them in float and rounds per ufunc), integers
// wrapping on overflow, bool multiply/add as logical and/or.
#pragma once

#include <cmath>
#include <limits>

#include "common.h"

namespace oc {

struct Bool8 {  // ORT's bool tensors: one byte, 0 or 1 (any non-zero byte reads as true)
  uint8_t v;
};

template <typename T>
struct Tag {
  using type = T;
};

// fn(Tag<T>{}) for a float element type; throws naming `allowed` for anything else.
template <typename Fn>
void dispatch_float(int elem, const char* what, const std::vector<int>& allowed, Fn&& fn) {
  bool ok = false;
  for (int e : allowed) ok = ok || e == elem;
  if (ok) {
    switch (elem) {
      case OC_ELEM_FLOAT: return fn(Tag<float>{});
      case OC_ELEM_DOUBLE: return fn(Tag<double>{});
      case OC_ELEM_FLOAT16: return fn(Tag<Half>{});
      case OC_ELEM_BFLOAT16: return fn(Tag<BFloat16>{});
      default: break;
    }
  }
  fail("%s has dtype %s; expected one of %s; fix: cast it (e.g. with a Cast node)", what,
       elem_name(elem), elem_list(allowed).c_str());
}

// The seed ops' dtypes (their one list: ``onnx_custom/ops/seed.yaml``), as the Python kernels and
// the eager ops accept them.
inline const std::vector<int>& numeric_elems() {
  static const std::vector<int> all = {OC_ELEM_FLOAT16, OC_ELEM_BFLOAT16, OC_ELEM_FLOAT,
                                       OC_ELEM_DOUBLE,  OC_ELEM_INT8,     OC_ELEM_INT16,
                                       OC_ELEM_INT32,   OC_ELEM_INT64,    OC_ELEM_UINT8};
  return all;
}

template <typename Fn>
void dispatch_numeric(int elem, const char* what, Fn&& fn) {
  switch (elem) {
    case OC_ELEM_FLOAT: return fn(Tag<float>{});
    case OC_ELEM_DOUBLE: return fn(Tag<double>{});
    case OC_ELEM_FLOAT16: return fn(Tag<Half>{});
    case OC_ELEM_BFLOAT16: return fn(Tag<BFloat16>{});
    case OC_ELEM_INT8: return fn(Tag<int8_t>{});
    case OC_ELEM_INT16: return fn(Tag<int16_t>{});
    case OC_ELEM_INT32: return fn(Tag<int32_t>{});
    case OC_ELEM_INT64: return fn(Tag<int64_t>{});
    case OC_ELEM_UINT8: return fn(Tag<uint8_t>{});
    default:
      fail("%s has dtype %s; expected one of %s; fix: cast it (e.g. with a Cast node)", what,
           elem_name(elem), elem_list(numeric_elems()).c_str());
  }
}

// numpy's `np.asarray(value, dtype=T)` for a float attribute value.
template <typename T>
T from_attr(double value) {
  if constexpr (std::is_same_v<T, Bool8>) {
    return Bool8{static_cast<uint8_t>(value != 0.0)};
  } else if constexpr (std::is_integral_v<T>) {
    // truncation toward zero; NaN and out-of-range values (undefined in C++) saturate
    if (std::isnan(value)) return T(0);
    if (value <= static_cast<double>(std::numeric_limits<T>::lowest())) {
      return std::numeric_limits<T>::lowest();
    }
    if (value >= static_cast<double>(std::numeric_limits<T>::max())) {
      return std::numeric_limits<T>::max();
    }
    return static_cast<T>(value);
  } else {
    return store<T>(value);
  }
}

// x * y and x + y in T with numpy's semantics (16-bit floats round the float result).
template <typename T>
inline T mul(T x, T y) {
  if constexpr (std::is_same_v<T, Bool8>) {
    return Bool8{static_cast<uint8_t>((x.v != 0) & (y.v != 0))};
  } else if constexpr (std::is_integral_v<T>) {
    // in 64-bit unsigned arithmetic: wraps like numpy, no signed overflow or int promotion
    return static_cast<T>(static_cast<uint64_t>(x) * static_cast<uint64_t>(y));
  } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return store<T>(load(x) * load(y));
  } else {
    return x * y;
  }
}

template <typename T>
inline T add(T x, T y) {
  if constexpr (std::is_same_v<T, Bool8>) {
    return Bool8{static_cast<uint8_t>((x.v != 0) | (y.v != 0))};
  } else if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<uint64_t>(x) + static_cast<uint64_t>(y));
  } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return store<T>(load(x) + load(y));
  } else {
    return x + y;
  }
}

}  // namespace oc
