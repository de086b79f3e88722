// Runtime of the generated user-kernel bindings (binding.h) and the hooks onnx_custom/kernel.h
// declares (output allocation, parallel_for on the running node's thread pool).
#include "binding.h"

#include <algorithm>

namespace onnx_custom {
namespace detail {

void* allocate_output(OutputSlot* slot, const Shape& shape, int elem) {
  if (elem != slot->elem) {
    oc::fail("output '%s' is %s, but the kernel allocates it as %s", slot->name, oc::elem_name(slot->elem),
             oc::elem_name(elem));
  }
  if (slot->allocated) {
    if (shape == slot->shape) return slot->data;
    oc::fail("output '%s' has shape %s (from the spec's shape rule, or an earlier allocate), but the kernel "
             "asks for %s; fix: make the kernel and the spec's shape rule agree",
             slot->name, oc::shape_str(slot->shape).c_str(), oc::shape_str(shape).c_str());
  }
  const oc::Tensor t = slot->ctx->output(slot->index, shape);
  slot->shape = shape;
  slot->data = t.data;
  slot->allocated = true;
  return slot->data;
}

const Shape* allocated_shape(const OutputSlot* slot) { return slot->allocated ? &slot->shape : nullptr; }

namespace {
thread_local oc::Context* t_current = nullptr;
}

void parallel_chunks(int64_t chunks, const std::function<void(int64_t)>& fn) {
  oc::Context* ctx = t_current;
  if (ctx == nullptr) {  // outside a kernel, or inside another parallel_for: inline
    for (int64_t c = 0; c < chunks; ++c) fn(c);
    return;
  }
  t_current = nullptr;  // chunks this thread runs itself must not nest into the pool
  try {
    ctx->parallel_for(static_cast<size_t>(chunks), [&](size_t c) { fn(static_cast<int64_t>(c)); });
  } catch (...) {
    t_current = ctx;
    throw;
  }
  t_current = ctx;
}

oc::Context* swap_current(oc::Context* ctx) {
  oc::Context* previous = t_current;
  t_current = ctx;
  return previous;
}

}  // namespace detail
}  // namespace onnx_custom

namespace oc {
namespace binding {

// ---- attributes --------------------------------------------------------------------------------------
[[noreturn]] static void missing(const char* name, const char* type, const char* example) {
  fail("the node lacks the required attribute '%s' (%s) (absent, or set with another type); the op spec "
       "gives it no default; fix: set it on the node, e.g. helper.make_node(..., %s=%s)",
       name, type, name, example);
}

int64_t attr_int(const Attributes& a, const char* name, const int64_t* fallback) {
  int64_t v = 0;
  if (a.get(name, &v)) return v;
  if (fallback == nullptr) missing(name, "INT", "1");
  return *fallback;
}

bool attr_bool(const Attributes& a, const char* name, const bool* fallback) {
  int64_t v = 0;
  if (a.get(name, &v)) return v != 0;
  if (fallback == nullptr) missing(name, "INT, 0 or 1", "1");
  return *fallback;
}

float attr_float(const Attributes& a, const char* name, const float* fallback) {
  float v = 0;
  if (a.get(name, &v)) return v;
  if (fallback == nullptr) missing(name, "FLOAT", "1.0");
  return *fallback;
}

std::string attr_string(const Attributes& a, const char* name, const char* fallback) {
  size_t size = 0;
  OrtStatus* st = OC_ORT(KernelInfoGetAttribute_string)(a.raw(), name, nullptr, &size);
  if (st == nullptr && size > 0) {
    std::string out(size, '\0');
    st = OC_ORT(KernelInfoGetAttribute_string)(a.raw(), name, &out[0], &size);
    if (st == nullptr) {
      out.resize(size ? size - 1 : 0);
      return out;
    }
  }
  if (st != nullptr) OC_ORT(ReleaseStatus)(st);
  if (fallback == nullptr) missing(name, "STRING", "'...'");
  return fallback;
}

std::vector<int64_t> attr_ints(const Attributes& a, const char* name, const std::vector<int64_t>* fallback) {
  std::vector<int64_t> v;
  if (a.get(name, &v)) return v;
  if (fallback == nullptr) missing(name, "INTS", "[1, 2]");
  return *fallback;
}

std::vector<float> attr_floats(const Attributes& a, const char* name, const std::vector<float>* fallback) {
  size_t n = 0;
  OrtStatus* st = OC_ORT(KernelInfoGetAttributeArray_float)(a.raw(), name, nullptr, &n);
  if (st == nullptr) {
    std::vector<float> v(n);
    if (n == 0) return v;
    st = OC_ORT(KernelInfoGetAttributeArray_float)(a.raw(), name, v.data(), &n);
    if (st == nullptr) {
      v.resize(n);
      return v;
    }
  }
  OC_ORT(ReleaseStatus)(st);
  if (fallback == nullptr) missing(name, "FLOATS", "[1.0, 2.0]");
  return *fallback;
}

std::vector<std::string> attr_strings(const Attributes& a, const char* name,
                                      const std::vector<std::string>* fallback) {
  if (g_api.version >= OC_SINCE_KernelInfoGetAttributeArray_string) {
    OrtAllocator* alloc = nullptr;
    check(OC_ORT(GetAllocatorWithDefaultOptions)(&alloc));
    char** items = nullptr;
    size_t n = 0;
    OrtStatus* st = OC_ORT(KernelInfoGetAttributeArray_string)(a.raw(), name, alloc, &items, &n);
    if (st == nullptr) {
      std::vector<std::string> out;
      for (size_t i = 0; i < n; ++i) {
        out.emplace_back(items[i]);
        OC_ORT(AllocatorFree)(alloc, items[i]);
      }
      if (items != nullptr) OC_ORT(AllocatorFree)(alloc, items);
      return out;
    }
    OC_ORT(ReleaseStatus)(st);
  } else if (fallback == nullptr) {
    fail("attribute '%s' (STRINGS) needs ONNX Runtime 1.21 or newer (C API 25)", name);
  }
  if (fallback == nullptr) missing(name, "STRINGS", "['a', 'b']");
  return *fallback;
}

// ---- inputs --------------------------------------------------------------------------------------------
Inputs::Inputs(const Context& ctx, std::vector<const char*> names, bool variadic) {
  const size_t count = ctx.input_count();
  for (size_t i = 0; i < count; ++i) {
    if (i >= names.size() && !variadic) break;
    raw_.push_back(ctx.input(i));
    names_.push_back(names[std::min(i, names.size() - 1)]);
  }
  while (raw_.size() < names.size()) {  // trailing optional inputs the node leaves out
    raw_.push_back(oc::Tensor());
    names_.push_back(names[raw_.size() - 1]);
  }
}

static std::string allowed_list(std::initializer_list<int> allowed) {
  return elem_list(std::vector<int>(allowed));
}

int Inputs::group_elem(std::initializer_list<size_t> group, std::initializer_list<int> allowed) const {
  int elem = OC_ELEM_UNDEFINED;
  size_t first = 0;
  std::vector<size_t> members;
  for (size_t g : group) {  // a variadic input stands for every node input from its index on
    for (size_t i = g; i < raw_.size() && (i == g || names_[i] == names_[g]); ++i) members.push_back(i);
  }
  for (size_t i : members) {
    const oc::Tensor& t = raw_[i];
    if (!t.present) continue;
    if (std::find(allowed.begin(), allowed.end(), t.elem) == allowed.end()) {
      fail("input '%s' has dtype %s; the op spec declares %s; fix: cast it (e.g. with a Cast node) or add "
           "the dtype to the spec and the kernel",
           names_[i], elem_name(t.elem), allowed_list(allowed).c_str());
    }
    if (elem == OC_ELEM_UNDEFINED) {
      elem = t.elem;
      first = i;
    } else if (t.elem != elem) {
      fail("input '%s' has dtype %s but input '%s' has %s; the op spec gives them one dtype list, so the "
           "kernel takes one element type for both; fix: cast one of them",
           names_[i], elem_name(t.elem), names_[first], elem_name(elem));
    }
  }
  return elem == OC_ELEM_UNDEFINED ? *allowed.begin() : elem;
}

void Inputs::require(size_t i, const oc::Tensor& t, int elem) const {
  if (t.elem != elem) {
    fail("input '%s' has dtype %s; the op spec declares %s; fix: cast it (e.g. with a Cast node)", names_[i],
         elem_name(t.elem), elem_name(elem));
  }
}

const Shape& Inputs::shape(size_t i) const {
  if (!raw_[i].present) {
    fail("optional input '%s' is absent, but the spec's shape rule of an output needs its shape", names_[i]);
  }
  return raw_[i].shape;
}

std::vector<const Shape*> Inputs::present_shapes() const {
  std::vector<const Shape*> out;
  for (const oc::Tensor& t : raw_) {
    if (t.present) out.push_back(&t.shape);
  }
  return out;
}

// ---- outputs ---------------------------------------------------------------------------------------------
Outputs::Outputs(Context& ctx, std::vector<const char*> names, std::vector<int> elems) : slots_(names.size()) {
  for (size_t i = 0; i < names.size(); ++i) {
    slots_[i].ctx = &ctx;
    slots_[i].index = i;
    slots_[i].name = names[i];
    slots_[i].elem = elems[i];
  }
}

void Outputs::finish() const {
  for (const OutputSlot& s : slots_) {
    if (!s.allocated) {
      fail("the kernel returned without allocating output '%s'; the op spec gives it no shape rule, so the "
           "kernel must call %s.allocate(shape)", s.name, s.name);
    }
  }
}

Scope::Scope(Context& ctx) : previous_(onnx_custom::detail::swap_current(&ctx)) {}
Scope::~Scope() { onnx_custom::detail::swap_current(previous_); }

Shape broadcast(const std::vector<const Shape*>& shapes) {
  size_t rank = 0;
  for (const Shape* s : shapes) rank = std::max(rank, s->size());
  Shape out(rank, 1);
  for (const Shape* s : shapes) {
    const size_t pad = rank - s->size();
    for (size_t d = 0; d < s->size(); ++d) {
      const int64_t x = out[pad + d], y = (*s)[d];
      if (x != y && x != 1 && y != 1) {
        fail("the inputs do not broadcast (dimension %zu: %lld vs %lld); expected equal dimensions or 1 "
             "(numpy broadcasting)", pad + d, static_cast<long long>(x), static_cast<long long>(y));
      }
      out[pad + d] = x == 1 ? y : x;
    }
  }
  return out;
}

int64_t py_floordiv(int64_t a, int64_t b) {
  if (b == 0) fail("shape rule: division by zero");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t py_mod(int64_t a, int64_t b) { return a - py_floordiv(a, b) * b; }

// ---- graph time -------------------------------------------------------------------------------------------
Infer::Infer(const InferContext& ctx, std::vector<const char*> names, bool variadic) : ctx_(ctx) {
  for (size_t i = 0;; ++i) {
    if (i >= names.size() && !variadic) break;
    TypeShape t = ctx.input(i);
    if (i >= names.size() && !t.present) break;
    inputs_.push_back(t);
    names_.push_back(names[std::min(i, names.size() - 1)]);
    if (i > 256) break;
  }
}

// A dtype outside `allowed` (or members disagreeing) is not refused here: ONNX Runtime does not
// report a shape-inference error, it replaces our output type with its own guess and then refuses
// the session with a type mismatch that names neither the input nor the fix. The output takes the
// first member's dtype instead, and the kernel's run-time check (Inputs::group_elem) reports it.
int Infer::group_elem(std::initializer_list<size_t> group, std::initializer_list<int> allowed) const {
  (void)allowed;
  for (size_t g : group) {
    if (g < inputs_.size() && inputs_[g].present) return inputs_[g].elem;
  }
  return OC_ELEM_UNDEFINED;
}

void Infer::require_elem(size_t i, int elem) const {
  if (i < inputs_.size() && inputs_[i].present && inputs_[i].elem != elem) {
    fail("input '%s' has dtype %s; the op spec declares %s; fix: cast it (e.g. with a Cast node)", names_[i],
         elem_name(inputs_[i].elem), elem_name(elem));
  }
}

bool Infer::ranks_known(std::initializer_list<size_t> inputs) const {
  for (size_t i : inputs) {
    if (i >= inputs_.size() || !inputs_[i].present || !inputs_[i].has_shape) return false;
  }
  return true;
}

std::vector<Dim> Infer::broadcast() const {
  size_t rank = 0;
  for (const TypeShape& t : inputs_) {
    if (t.present && !t.has_shape) fail("an input has unknown rank; output shape left to run time");
    if (t.present) rank = std::max(rank, t.dims.size());
  }
  std::vector<Dim> out(rank, Dim::known(1));
  for (const TypeShape& t : inputs_) {
    if (!t.present) continue;
    const size_t pad = rank - t.dims.size();
    for (size_t d = 0; d < t.dims.size(); ++d) {
      Dim& o = out[pad + d];
      const Dim& x = t.dims[d];
      if (o.value == 1) {
        o = x;
      } else if (x.value == 1 || o == x) {
      } else if (o.is_known() && x.is_known()) {
        fail("the inputs do not broadcast: dimension %lld vs %lld", static_cast<long long>(o.value),
             static_cast<long long>(x.value));
      } else if (!o.is_known()) {
        o = x.is_known() ? x : Dim::unknown();
      }
    }
  }
  return out;
}

int64_t Infer::attr_int(const char* name, const int64_t* fallback) const {
  int64_t v = 0;
  if (ctx_.attr(name, &v)) return v;
  if (fallback == nullptr) missing(name, "INT", "1");
  return *fallback;
}

std::vector<int64_t> Infer::attr_ints(const char* name, const std::vector<int64_t>* fallback) const {
  std::vector<int64_t> v;
  if (ctx_.attr(name, &v)) return v;
  if (fallback == nullptr) missing(name, "INTS", "[1, 2]");
  return *fallback;
}

}  // namespace binding
}  // namespace oc
