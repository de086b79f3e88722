// onnx_custom/kernel.h: write the math of a custom op, get an ONNX Runtime kernel.
//
// A native kernel is a plain C++ function (usually a template over the element type) that takes
// the op's inputs, then its outputs, then its attributes, in the op spec's order:
//
//   #include <onnx_custom/kernel.h>
//   using onnx_custom::Tensor;
//
//   template <typename T>  // float, onnx_custom::float16, ... : one instantiation per spec dtype
//   void scale_add(const Tensor<T>& x, const Tensor<T>& y, Tensor<T>& out, float alpha) {
//     onnx_custom::parallel_for(out.size(), 1 << 14, [&](int64_t begin, int64_t end) {
//       for (int64_t i = begin; i < end; ++i) out[i] = T(alpha * float(x[i]) + float(y[i]));
//     });
//   }
//
// `onnx-custom build-library --spec acme.yaml` generates the ONNX Runtime registration around it
// (domain, node type, inputs, attributes with their defaults, dtype checks, shape inference) and
// compiles everything into one library that plain ONNX Runtime loads from any language.
//
// Argument types, by what the spec declares:
//   input                 const Tensor<T>&          (T: the storage type of its dtype, below)
//   optional input        const Tensor<T>&          (absent: !x.present(), no data)
//   variadic input        const std::vector<Tensor<T>>&
//   output                Tensor<T>&                (allocated from the spec's shape rule before the
//                                                    call; without a rule the kernel calls
//                                                    out.allocate(shape) itself: data-dependent shapes)
//   attribute int / bool  int64_t / bool            float: float, str: std::string,
//   int[] / float[]       std::vector<int64_t> / std::vector<float>, str[]: std::vector<std::string>
// dtype -> T: float32 float, float64 double, float16 onnx_custom::float16, bfloat16
// onnx_custom::bfloat16, int8..int64 int8_t..int64_t, uint8..uint64 uint8_t..uint64_t, bool bool.
// Inputs sharing one dtype list of several dtypes share one template parameter (the generated code
// checks at run time that they agree); single-dtype inputs (index tensors: int64) have a fixed T.
//
// Errors: throw anything derived from std::exception (onnx_custom::fail("...") is a shortcut).
// ONNX Runtime then reports an error status naming the op and the node ("onnx-custom native kernel
// acme::ScaleAdd (node 'n0') failed: <your message>"); an exception never crashes the process.
//
// Tensors are ONNX Runtime's buffers: dense, row-major (strides() tells the element strides),
// CPU memory, valid only during the call.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "onnx_custom/half.h"

namespace onnx_custom {

// ---- 16-bit floating-point storage types ---------------------------------------------------------
// Storage only: they convert to float for arithmetic and back (rounding to nearest even), so
// `out[i] = T(alpha * float(x[i]))` works for every floating T.
struct float16 {
  uint16_t bits = 0;
  float16() = default;
  float16(float v) : bits(float_to_half(v)) {}  // NOLINT(google-explicit-constructor)
  operator float() const { return half_to_float(bits); }  // NOLINT(google-explicit-constructor)
  static float16 from_bits(uint16_t b) {
    float16 h;
    h.bits = b;
    return h;
  }
};

struct bfloat16 {
  uint16_t bits = 0;
  bfloat16() = default;
  bfloat16(float v) : bits(float_to_bf16(v)) {}  // NOLINT(google-explicit-constructor)
  operator float() const { return bf16_to_float(bits); }  // NOLINT(google-explicit-constructor)
  static bfloat16 from_bits(uint16_t b) {
    bfloat16 h;
    h.bits = b;
    return h;
  }
};

static_assert(sizeof(float16) == 2 && sizeof(bfloat16) == 2, "16-bit storage types");

// The type to accumulate in: float for the 16-bit formats, T otherwise.
template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>, float, T>;

// ---- element types --------------------------------------------------------------------------------
// dtype<T>::name ("float32") and ::onnx (the ONNX TensorProto element type number).
template <typename T> struct dtype;
#define ONNX_CUSTOM_DTYPE(T, NAME, ONNX)         \
  template <> struct dtype<T> {                  \
    static constexpr const char* name = NAME;    \
    static constexpr int onnx = ONNX;            \
  };
ONNX_CUSTOM_DTYPE(float, "float32", 1)
ONNX_CUSTOM_DTYPE(uint8_t, "uint8", 2)
ONNX_CUSTOM_DTYPE(int8_t, "int8", 3)
ONNX_CUSTOM_DTYPE(uint16_t, "uint16", 4)
ONNX_CUSTOM_DTYPE(int16_t, "int16", 5)
ONNX_CUSTOM_DTYPE(int32_t, "int32", 6)
ONNX_CUSTOM_DTYPE(int64_t, "int64", 7)
ONNX_CUSTOM_DTYPE(bool, "bool", 9)
ONNX_CUSTOM_DTYPE(float16, "float16", 10)
ONNX_CUSTOM_DTYPE(double, "float64", 11)
ONNX_CUSTOM_DTYPE(uint32_t, "uint32", 12)
ONNX_CUSTOM_DTYPE(uint64_t, "uint64", 13)
ONNX_CUSTOM_DTYPE(bfloat16, "bfloat16", 16)
#undef ONNX_CUSTOM_DTYPE

// ---- errors ----------------------------------------------------------------------------------------
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail(const std::string& message) { throw Error(message); }

using Shape = std::vector<int64_t>;

inline std::string to_string(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

namespace detail {
// Implemented by the generated binding's runtime (ort_kernels/native/binding.cpp).
struct OutputSlot;
void* allocate_output(OutputSlot* slot, const Shape& shape, int elem);
const Shape* allocated_shape(const OutputSlot* slot);  // nullptr until allocated
void parallel_chunks(int64_t chunks, const std::function<void(int64_t)>& fn);
}  // namespace detail

// ---- tensors -----------------------------------------------------------------------------------------
template <typename T>
class Tensor {
 public:
  Tensor() = default;  // an absent optional input

  // Built by the generated binding: an input view, or an output to be allocated.
  static Tensor view(const char* name, Shape shape, T* data) {
    Tensor t;
    t.name_ = name;
    t.present_ = true;
    t.data_ = data;
    t.set_shape(std::move(shape));
    return t;
  }
  static Tensor output(const char* name, detail::OutputSlot* slot) {
    Tensor t;
    t.name_ = name;
    t.present_ = true;
    t.slot_ = slot;
    return t;
  }

  bool present() const { return present_; }
  explicit operator bool() const { return present_; }
  const char* name() const { return name_; }
  static constexpr const char* dtype_name() { return dtype<T>::name; }

  const Shape& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  // Size of dimension i; negative i counts from the end (-1: the last).
  int64_t dim(int64_t i) const {
    const int64_t r = rank();
    if (i < -r || i >= r) {
      fail(std::string("dimension ") + std::to_string(i) + " of " + what() + " is out of range; it has rank " + std::to_string(r));
    }
    return shape_[static_cast<size_t>(i < 0 ? i + r : i)];
  }
  int64_t size() const { return size_; }  // number of elements
  // Element strides (row-major, dense: the last is 1).
  Shape strides() const {
    Shape s(shape_.size(), 1);
    for (size_t i = shape_.size(); i > 1; --i) s[i - 2] = s[i - 1] * shape_[i - 1];
    return s;
  }

  const T* data() const { return ready(); }
  T* data() { return ready(); }
  const T& operator[](int64_t i) const { return data_[i]; }
  T& operator[](int64_t i) { return data_[i]; }

  // Outputs: allocate with `shape` (once). An output the spec's shape rule already allocated may be
  // "allocated" again with the same shape (a no-op); another shape is an error naming both.
  T* allocate(const Shape& shape) {
    if (slot_ == nullptr) fail(std::string("allocate() called on ") + what() + ", which is an input");
    for (int64_t d : shape) {
      if (d < 0) fail(std::string("allocate(") + to_string(shape) + ") for " + what() + ": dimensions must be >= 0");
    }
    data_ = static_cast<T*>(detail::allocate_output(slot_, shape, dtype<T>::onnx));
    set_shape(shape);
    return data_;
  }
  bool allocated() const { return data_ != nullptr || (slot_ != nullptr && detail::allocated_shape(slot_) != nullptr); }

 private:
  std::string what() const { return std::string(slot_ ? "output '" : "input '") + (name_ ? name_ : "?") + "'"; }
  T* ready() const {
    if (!present_) fail(what() + " is absent (an optional input the node does not have); check present() first");
    if (slot_ != nullptr && detail::allocated_shape(slot_) == nullptr) {
      fail(what() + " is not allocated yet; the spec gives it no shape rule, so call allocate(shape) first");
    }
    return data_;
  }
  void set_shape(Shape shape) {
    shape_ = std::move(shape);
    size_ = 1;
    for (int64_t d : shape_) size_ *= d;
  }

  const char* name_ = nullptr;
  bool present_ = false;
  Shape shape_;
  int64_t size_ = 0;
  T* data_ = nullptr;
  detail::OutputSlot* slot_ = nullptr;
};

// ---- threads -------------------------------------------------------------------------------------------
// fn(begin, end) over [0, total) in chunks of about `grain` items, on ONNX Runtime's intra-op thread
// pool of the running node (SessionOptions.intra_op_num_threads); inline when the pool has one
// thread, when called outside a kernel, or from inside another parallel_for. Returns after every
// chunk ran; the first exception a chunk throws is re-thrown here.
inline void parallel_for(int64_t total, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (total <= 0) return;
  if (grain < 1) grain = 1;
  const int64_t chunks = (total + grain - 1) / grain;
  if (chunks == 1) {
    fn(0, total);
    return;
  }
  detail::parallel_chunks(chunks, [&](int64_t c) {
    const int64_t base = total / chunks, extra = total % chunks;
    const int64_t begin = c * base + (c < extra ? c : extra);
    fn(begin, begin + base + (c < extra ? 1 : 0));
  });
}

}  // namespace onnx_custom
