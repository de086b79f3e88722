// User-style kernels for the native-library tests: written against onnx_custom/kernel.h only,
// the way a user would (templates over the element type, std exceptions, parallel_for).
#include <onnx_custom/kernel.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <thread>
#include <string>
#include <vector>

using onnx_custom::Tensor;

// out = alpha * x + y (x, y of one shape), any floating dtype.
template <typename T>
void scale_add(const Tensor<T>& x, const Tensor<T>& y, Tensor<T>& out, float alpha) {
  if (x.shape() != y.shape()) {
    onnx_custom::fail("x " + onnx_custom::to_string(x.shape()) + " and y " + onnx_custom::to_string(y.shape()) +
                      " must have one shape");
  }
  const T* px = x.data();
  const T* py = y.data();
  T* po = out.data();
  onnx_custom::parallel_for(out.size(), 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) po[i] = T(alpha * float(px[i]) + float(py[i]));
  });
}

// y = scale * (x + bias + sum(others)) (bias optional, broadcast over the last dim; others of x's
// shape), rowsum = y summed over the last dim. Two outputs, an optional and a variadic input.
template <typename T>
void mix(const Tensor<T>& x, const Tensor<T>& bias, const std::vector<Tensor<T>>& others, Tensor<T>& y,
         Tensor<T>& rowsum, float scale) {
  const int64_t inner = x.rank() ? x.dim(-1) : 1;
  if (bias.present() && bias.size() != inner) {
    onnx_custom::fail("bias must have " + std::to_string(inner) + " elements, got " + std::to_string(bias.size()));
  }
  for (const Tensor<T>& o : others) {
    if (o.shape() != x.shape()) onnx_custom::fail("every extra input must have x's shape");
  }
  const int64_t rows = inner ? x.size() / inner : 0;
  for (int64_t r = 0; r < rows; ++r) {
    onnx_custom::acc_t<T> total = 0;
    for (int64_t c = 0; c < inner; ++c) {
      const int64_t i = r * inner + c;
      onnx_custom::acc_t<T> v = x[i];
      if (bias) v += bias[c];
      for (const Tensor<T>& o : others) v += o[i];
      y[i] = T(scale * v);
      total += scale * v;
    }
    rowsum[r] = T(total);
  }
}

// The strictly positive elements of x, in order: an output whose size depends on the data.
template <typename T>
void positive(const Tensor<T>& x, Tensor<T>& values) {
  int64_t n = 0;
  for (int64_t i = 0; i < x.size(); ++i) n += float(x[i]) > 0.0f;
  T* out = values.allocate({n});
  for (int64_t i = 0, j = 0; i < x.size(); ++i) {
    if (float(x[i]) > 0.0f) out[j++] = x[i];
  }
}

// sqrt(x); negative elements are an error (thrown from inside parallel_for).
template <typename T>
void checked_sqrt(const Tensor<T>& x, Tensor<T>& out, int64_t fault) {
  if (fault == 1) throw 42;  // not a std::exception: must still become an error status
  onnx_custom::parallel_for(x.size(), 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (float(x[i]) < 0.0f) throw std::domain_error("negative input at index " + std::to_string(i));
      out[i] = T(std::sqrt(float(x[i])));
    }
  });
  if (fault == 2) out.allocate({out.size() + 1});  // the wrong output size: refused, not written
}

// out[i, :] = table[index[i] + offset, :] * weights (int64 indices, several attribute types).
template <typename T>
void gather_rows(const Tensor<T>& table, const Tensor<int64_t>& index, Tensor<T>& out, int64_t offset,
                 const std::string& mode, const std::vector<float>& weights, bool negate) {
  const int64_t rows = table.dim(0), cols = table.dim(1);
  if (!weights.empty() && static_cast<int64_t>(weights.size()) != cols) {
    onnx_custom::fail("weights must have one value per column");
  }
  for (int64_t i = 0; i < index.size(); ++i) {
    int64_t r = index[i] + offset;
    if (r < 0 || r >= rows) {
      if (mode == "clip") {
        r = r < 0 ? 0 : rows - 1;
      } else {
        onnx_custom::fail("index " + std::to_string(index[i]) + " at position " + std::to_string(i) +
                          " is out of range for " + std::to_string(rows) + " rows");
      }
    }
    for (int64_t c = 0; c < cols; ++c) {
      float v = float(table[r * cols + c]) * (weights.empty() ? 1.0f : weights[c]);
      out[i * cols + c] = T(negate ? -v : v);
    }
  }
}

// out[i] = a hash of the thread that ran element i (each element sleeps 2 ms, so ORT's pool has
// time to hand chunks to several threads): shows parallel_for runs on the intra-op pool.
void thread_ids(const Tensor<float>& x, Tensor<int64_t>& out) {
  onnx_custom::parallel_for(x.size(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      out[i] = static_cast<int64_t>(std::hash<std::thread::id>()(std::this_thread::get_id()) & 0x7fffffff);
    }
  });
}
