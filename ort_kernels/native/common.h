// Shared plumbing of the native kernels: the ORT function table, errors, tensors, attributes,
// shape inference, ORT's intra-op thread pool, half-precision conversion, and the op glue that
// turns a kernel class into an OcCustomOp. Kernels throw oc::Error; the glue turns it into an ORT
// status at the ABI boundary, so no C++ exception ever crosses into ONNX Runtime.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "onnx_custom/half.h"      // onnx_custom/runtime/include: on the include path
#include "onnx_custom_ort_abi.h"

namespace oc {

// ---- the OrtApi table negotiated in RegisterCustomOps ------------------------------------------
struct Api {
  const void* table = nullptr;
  int version = 0;
};
extern Api g_api;
#define OC_ORT(Name) OC_API(::oc::g_api.table, Name)

// ---- errors ---------------------------------------------------------------------------------------
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, int code = OC_ORT_INVALID_ARGUMENT)
      : std::runtime_error(message), code(code) {}
  int code;
};

[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void check(OrtStatus* status);  // throws Error carrying ORT's message when status is an error
OrtStatus* make_status(int code, const std::string& message);

// ---- element types ----------------------------------------------------------------------------------
const char* elem_name(int elem);
std::string elem_list(const std::vector<int>& elems);  // "float32, float64"

// Half-precision storage types; arithmetic happens in float.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

// The conversions live in the shipped header onnx_custom/half.h (shared with the user kernel API).
using onnx_custom::bf16_to_float;
using onnx_custom::float_to_bf16;
using onnx_custom::float_to_half;
using onnx_custom::half_to_float;

// Load/store any supported float storage type as its compute type.
inline float load(Half h) { return half_to_float(h.bits); }
inline float load(BFloat16 b) { return bf16_to_float(b.bits); }
inline float load(float f) { return f; }
inline double load(double d) { return d; }
template <typename T, typename V>
inline T store(V v) {
  if constexpr (std::is_same_v<T, Half>) {
    return Half{float_to_half(static_cast<float>(v))};
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return BFloat16{float_to_bf16(static_cast<float>(v))};
  } else {
    return static_cast<T>(v);
  }
}
// Compute type: float for the 16-bit formats, the type itself otherwise.
template <typename T>
using Compute = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;

// ---- shapes and tensors -----------------------------------------------------------------------------
using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& shape);
int64_t numel(const Shape& shape);

struct Tensor {
  bool present = false;
  int elem = OC_ELEM_UNDEFINED;
  Shape shape;
  void* data = nullptr;
  int64_t size = 0;  // number of elements

  size_t rank() const { return shape.size(); }
  int64_t dim(size_t i) const { return shape[i]; }
  template <typename T>
  const T* as() const { return static_cast<const T*>(data); }
  template <typename T>
  T* mut() const { return static_cast<T*>(data); }
};

class Context {
 public:
  explicit Context(OrtKernelContext* raw) : raw_(raw) {}
  size_t input_count() const;
  // Input i; present == false for an absent optional input (or i past the node's inputs).
  Tensor input(size_t i) const;
  Tensor output(size_t i, const Shape& shape);
  // fn(i) for i in [0, total) on ORT's intra-op thread pool (inline when it has one thread). The
  // first exception a task throws is re-thrown here after every task finished.
  void parallel_for(size_t total, const std::function<void(size_t)>& fn) const;
  OrtKernelContext* raw() const { return raw_; }

 private:
  OrtKernelContext* raw_;
};

// [begin, end) of chunk `i` when `total` items are split into `chunks` near-equal chunks.
inline void chunk_range(int64_t total, int64_t chunks, int64_t i, int64_t* begin, int64_t* end) {
  const int64_t base = total / chunks, extra = total % chunks;
  *begin = i * base + (i < extra ? i : extra);
  *end = *begin + base + (i < extra ? 1 : 0);
}

// ---- attributes at kernel creation ------------------------------------------------------------------
class Attributes {
 public:
  explicit Attributes(const OrtKernelInfo* info) : info_(info) {}
  // false when the node lacks the attribute (or carries it with another type).
  bool get(const char* name, int64_t* out) const;
  bool get(const char* name, float* out) const;
  bool get(const char* name, std::vector<int64_t>* out) const;
  int64_t int_or(const char* name, int64_t fallback) const;
  float float_or(const char* name, float fallback) const;
  std::vector<int64_t> ints(const char* name) const;  // required
  float float_required(const char* name) const;
  const OrtKernelInfo* raw() const { return info_; }

 private:
  const OrtKernelInfo* info_;
};

// ---- graph-time shape inference ----------------------------------------------------------------------
// A dimension: value >= 0 when known, else `symbol` (a dim_param such as "batch") or unknown.
struct Dim {
  int64_t value = -1;
  std::string symbol;
  static Dim known(int64_t v) { return Dim{v, std::string()}; }
  static Dim unknown() { return Dim{}; }
  bool is_known() const { return value >= 0; }
  bool operator==(const Dim& o) const { return value == o.value && symbol == o.symbol; }
};

struct TypeShape {
  bool present = false;   // the node has this input and ORT knows its type
  int elem = OC_ELEM_UNDEFINED;
  bool has_shape = false;  // rank known
  std::vector<Dim> dims;
};

class InferContext {
 public:
  explicit InferContext(OrtShapeInferContext* raw) : raw_(raw) {}
  TypeShape input(size_t i) const;
  bool attr(const char* name, int64_t* out) const;
  bool attr(const char* name, float* out) const;
  bool attr(const char* name, std::vector<int64_t>* out) const;
  // Declares output i: element type plus dims (rank known). Outputs of unknown rank are left
  // undeclared by throwing from the op's infer function instead.
  void set_output(size_t i, int elem, const std::vector<Dim>& dims) const;

 private:
  OrtShapeInferContext* raw_;
};

// ---- op glue --------------------------------------------------------------------------------------------
class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual void compute(Context& ctx) = 0;
};

struct OpDef {
  const char* domain;
  const char* name;
  std::vector<int> inputs;   // OC_IO_REQUIRED / OC_IO_OPTIONAL per input
  std::vector<int> outputs;  // per output
  std::unique_ptr<Kernel> (*create)(const Attributes& attrs);
  void (*infer)(const InferContext& ctx);
  // Element type ORT may assume per input / output (OC_ELEM_UNDEFINED or absent: any; the
  // kernel checks). A declared type is what ORT's graph-time type inference uses.
  std::vector<int> input_types = {};
  std::vector<int> output_types = {};
};

// Every op of the library (filled by the op family files through their add_* functions).
void add_seed_ops(std::vector<OpDef>& ops);
void add_multi_out3_ops(std::vector<OpDef>& ops);
void add_deform_conv_ops(std::vector<OpDef>& ops);
void add_bev_pool_ops(std::vector<OpDef>& ops);
void add_custom_linear_ops(std::vector<OpDef>& ops);
void add_msda_ops(std::vector<OpDef>& ops);
void add_user_ops(std::vector<OpDef>& ops);  // generated for libraries built from user op specs
const std::vector<OpDef>& all_ops();

template <typename K>
std::unique_ptr<Kernel> create_kernel(const Attributes& attrs) {
  return std::unique_ptr<Kernel>(new K(attrs));
}

// Checks shared by the kernels.
void require_dtype(const char* what, const Tensor& t, const std::vector<int>& allowed);
void require_same_dtype(const char* what, const Tensor& t, const char* ref_name, const Tensor& ref);
void require_rank(const char* what, const Tensor& t, size_t rank, const char* layout);

}  // namespace oc
