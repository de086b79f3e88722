// Runtime of the generated bindings of user kernels (onnx_custom/kernel.h): what the code that
// `onnx_custom.spec.native_library` generates per op calls — attributes with the spec's defaults,
// inputs checked against the spec's dtype lists, outputs allocated from shape rules, the
// thread-local node context behind onnx_custom::parallel_for, and the shape-rule arithmetic on
// run-time sizes (int64_t) and graph-time dims (oc::Dim).
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "common.h"
#include "onnx_custom/kernel.h"

namespace oc {
class Context;
}

namespace onnx_custom {
namespace detail {
// One output of the running node: allocated once, by the shape rule or by the kernel.
struct OutputSlot {
  oc::Context* ctx = nullptr;
  size_t index = 0;
  const char* name = "";
  int elem = 0;
  bool allocated = false;
  Shape shape;
  void* data = nullptr;
};
// Makes `ctx` the node onnx_custom::parallel_for runs on (this thread); returns the previous one.
oc::Context* swap_current(oc::Context* ctx);
}  // namespace detail
}  // namespace onnx_custom

namespace oc {
namespace binding {

using onnx_custom::Tensor;
using onnx_custom::detail::OutputSlot;

// ---- attributes at kernel creation (fallback == nullptr: the node must carry it) -------------------
int64_t attr_int(const Attributes& a, const char* name, const int64_t* fallback);
bool attr_bool(const Attributes& a, const char* name, const bool* fallback);
float attr_float(const Attributes& a, const char* name, const float* fallback);
std::string attr_string(const Attributes& a, const char* name, const char* fallback);
std::vector<int64_t> attr_ints(const Attributes& a, const char* name, const std::vector<int64_t>* fallback);
std::vector<float> attr_floats(const Attributes& a, const char* name, const std::vector<float>* fallback);
std::vector<std::string> attr_strings(const Attributes& a, const char* name,
                                      const std::vector<std::string>* fallback);

// ---- inputs ----------------------------------------------------------------------------------------
class Inputs {
 public:
  // names[i] of the spec's inputs; variadic: the last input takes every remaining node input.
  Inputs(const Context& ctx, std::vector<const char*> names, bool variadic);
  // The dtype shared by the present inputs of a group (the inputs of one template parameter),
  // checked against the spec's list `allowed`; the first of `allowed` when none is present.
  int group_elem(std::initializer_list<size_t> group, std::initializer_list<int> allowed) const;

  template <typename T>
  Tensor<T> tensor(size_t i) const {
    const oc::Tensor& t = raw_[i];
    if (!t.present) return Tensor<T>();
    require(i, t, onnx_custom::dtype<T>::onnx);
    return Tensor<T>::view(names_[i], t.shape, static_cast<T*>(t.data));
  }
  template <typename T>
  std::vector<Tensor<T>> variadic(size_t first) const {
    std::vector<Tensor<T>> out;
    for (size_t i = first; i < raw_.size(); ++i) {
      require(i, raw_[i], onnx_custom::dtype<T>::onnx);
      out.push_back(Tensor<T>::view(names_[first], raw_[i].shape, static_cast<T*>(raw_[i].data)));
    }
    return out;
  }
  const Shape& shape(size_t i) const;  // of a present input (absent: an error naming it)
  std::vector<const Shape*> present_shapes() const;

 private:
  void require(size_t i, const oc::Tensor& t, int elem) const;
  std::vector<oc::Tensor> raw_;
  std::vector<const char*> names_;  // one per raw_ entry
};

// ---- outputs ---------------------------------------------------------------------------------------
class Outputs {
 public:
  Outputs(Context& ctx, std::vector<const char*> names, std::vector<int> elems);
  template <typename T>
  Tensor<T> tensor(size_t i) {
    return Tensor<T>::output(slots_[i].name, &slots_[i]);
  }
  void finish() const;  // every output allocated

 private:
  std::vector<OutputSlot> slots_;  // never resized after construction: tensors point into it
};

// While alive, onnx_custom::parallel_for on this thread uses `ctx`'s thread pool.
class Scope {
 public:
  explicit Scope(Context& ctx);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Context* previous_;
};

Shape broadcast(const std::vector<const Shape*>& shapes);

// ---- graph-time shape inference ---------------------------------------------------------------------
class Infer {
 public:
  Infer(const InferContext& ctx, std::vector<const char*> names, bool variadic);
  // The group's dtype: its first present member's (OC_ELEM_UNDEFINED when ORT does not know it yet).
  // A dtype outside `allowed` is reported by the kernel at run time (see binding.cpp: ORT would
  // replace a graph-time error with a type mismatch naming neither the input nor the fix).
  int group_elem(std::initializer_list<size_t> group, std::initializer_list<int> allowed) const;
  void require_elem(size_t i, int elem) const;
  bool ranks_known(std::initializer_list<size_t> inputs) const;
  const std::vector<Dim>& dims(size_t i) const { return inputs_[i].dims; }
  std::vector<Dim> broadcast() const;
  int64_t attr_int(const char* name, const int64_t* fallback) const;
  std::vector<int64_t> attr_ints(const char* name, const std::vector<int64_t>* fallback) const;
  void set(size_t output, int elem, const std::vector<Dim>& dims) const { ctx_.set_output(output, elem, dims); }

 private:
  const InferContext& ctx_;
  std::vector<TypeShape> inputs_;
  std::vector<const char*> names_;
};

// ---- shape-rule arithmetic: V = int64_t with S = Shape (run time), V = Dim with S = vector<Dim> ----
template <typename V> V lit(int64_t v);
template <> inline int64_t lit<int64_t>(int64_t v) { return v; }
template <> inline Dim lit<Dim>(int64_t v) { return Dim::known(v); }

inline bool known(int64_t) { return true; }
inline bool known(const Dim& d) { return d.is_known(); }
inline int64_t value(int64_t v) { return v; }
inline int64_t value(const Dim& d) { return d.value; }
inline Dim wrap(const Dim&, int64_t v) { return Dim::known(v); }
inline int64_t wrap(int64_t, int64_t v) { return v; }

int64_t py_floordiv(int64_t a, int64_t b);
int64_t py_mod(int64_t a, int64_t b);

template <typename V, typename Fn>
V arith(const V& a, const V& b, Fn fn) {
  if (!known(a) || !known(b)) return V();  // Dim(): unknown
  return wrap(a, fn(value(a), value(b)));
}
template <typename V> V add(const V& a, const V& b) { return arith(a, b, [](int64_t x, int64_t y) { return x + y; }); }
template <typename V> V sub(const V& a, const V& b) { return arith(a, b, [](int64_t x, int64_t y) { return x - y; }); }
template <typename V> V mul(const V& a, const V& b) { return arith(a, b, [](int64_t x, int64_t y) { return x * y; }); }
template <typename V> V floordiv(const V& a, const V& b) { return arith(a, b, py_floordiv); }
template <typename V> V mod(const V& a, const V& b) { return arith(a, b, py_mod); }
template <typename V> V neg(const V& a) { return known(a) ? wrap(a, -value(a)) : V(); }
template <typename V> V vmax(std::initializer_list<V> items) {
  V best = *items.begin();
  for (const V& v : items) {
    if (!known(v) || !known(best)) return V();
    if (value(v) > value(best)) best = v;
  }
  return best;
}
template <typename V> V vmin(std::initializer_list<V> items) {
  V best = *items.begin();
  for (const V& v : items) {
    if (!known(v) || !known(best)) return V();
    if (value(v) < value(best)) best = v;
  }
  return best;
}
template <typename S> auto at(const S& s, int64_t i, const char* rule) -> typename S::value_type {
  const int64_t r = static_cast<int64_t>(s.size());
  if (i < -r || i >= r) {
    fail("shape rule '%s': index %lld is out of range for a shape of rank %lld", rule,
         static_cast<long long>(i), static_cast<long long>(r));
  }
  return s[static_cast<size_t>(i < 0 ? i + r : i)];
}
template <typename S> S slice(const S& s, bool has_lo, int64_t lo, bool has_hi, int64_t hi) {
  const int64_t r = static_cast<int64_t>(s.size());
  auto clamp = [r](int64_t v) { return v < 0 ? std::max<int64_t>(0, v + r) : std::min(v, r); };
  const int64_t b = has_lo ? clamp(lo) : 0, e = has_hi ? clamp(hi) : r;
  return b < e ? S(s.begin() + b, s.begin() + e) : S();
}
template <typename S> S cat(std::initializer_list<S> parts) {
  S out;
  for (const S& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}
template <typename S> auto len(const S& s) -> typename S::value_type {
  return lit<typename S::value_type>(static_cast<int64_t>(s.size()));
}
template <typename S> S ints_to(const std::vector<int64_t>& v) {
  S out;
  for (int64_t x : v) out.push_back(lit<typename S::value_type>(x));
  return out;
}

}  // namespace binding
}  // namespace oc
