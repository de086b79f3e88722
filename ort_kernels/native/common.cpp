// Helpers declared in common.h: errors, tensors, attributes, shape inference, thread pool.
#include "common.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <mutex>

namespace oc {

Api g_api;

void fail(const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  throw Error(buf);
}

void check(OrtStatus* status) {
  if (status == nullptr) return;
  const std::string message = OC_ORT(GetErrorMessage)(status);
  const int code = OC_ORT(GetErrorCode)(status);
  OC_ORT(ReleaseStatus)(status);
  throw Error(message, code == OC_ORT_OK ? OC_ORT_FAIL : code);
}

OrtStatus* make_status(int code, const std::string& message) {
  return OC_ORT(CreateStatus)(code, message.c_str());
}

const char* elem_name(int elem) {
  switch (elem) {
    case OC_ELEM_FLOAT: return "float32";
    case OC_ELEM_DOUBLE: return "float64";
    case OC_ELEM_FLOAT16: return "float16";
    case OC_ELEM_BFLOAT16: return "bfloat16";
    case OC_ELEM_INT8: return "int8";
    case OC_ELEM_INT16: return "int16";
    case OC_ELEM_INT32: return "int32";
    case OC_ELEM_INT64: return "int64";
    case OC_ELEM_UINT8: return "uint8";
    case OC_ELEM_UINT16: return "uint16";
    case OC_ELEM_UINT32: return "uint32";
    case OC_ELEM_UINT64: return "uint64";
    case OC_ELEM_BOOL: return "bool";
    case OC_ELEM_STRING: return "string";
    default: return "an unsupported element type";
  }
}

std::string elem_list(const std::vector<int>& elems) {
  std::string out;
  for (size_t i = 0; i < elems.size(); ++i) {
    if (i) out += ", ";
    out += elem_name(elems[i]);
  }
  return out;
}

std::string shape_str(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---- Context ----------------------------------------------------------------------------------------
size_t Context::input_count() const {
  size_t n = 0;
  check(OC_ORT(KernelContext_GetInputCount)(raw_, &n));
  return n;
}

static Tensor describe(const OrtValue* value) {
  Tensor t;
  t.present = true;
  if (g_api.version >= OC_SINCE_GetTensorElementTypeAndShapeDataReference) {
    const int64_t* dims = nullptr;
    size_t rank = 0;
    check(OC_ORT(GetTensorElementTypeAndShapeDataReference)(value, &t.elem, &dims, &rank));
    t.shape.assign(dims, dims + rank);
  } else {
    OrtTensorTypeAndShapeInfo* info = nullptr;
    check(OC_ORT(GetTensorTypeAndShape)(value, &info));
    size_t rank = 0;
    OrtStatus* st = OC_ORT(GetTensorElementType)(info, &t.elem);
    if (st == nullptr) st = OC_ORT(GetDimensionsCount)(info, &rank);
    if (st == nullptr) {
      t.shape.resize(rank);
      st = OC_ORT(GetDimensions)(info, t.shape.data(), rank);
    }
    OC_ORT(ReleaseTensorTypeAndShapeInfo)(info);
    check(st);
  }
  t.size = numel(t.shape);
  check(OC_ORT(GetTensorMutableData)(const_cast<OrtValue*>(value), &t.data));
  return t;
}

Tensor Context::input(size_t i) const {
  if (i >= input_count()) return Tensor();
  const OrtValue* value = nullptr;
  check(OC_ORT(KernelContext_GetInput)(raw_, i, &value));
  return value == nullptr ? Tensor() : describe(value);
}

Tensor Context::output(size_t i, const Shape& shape) {
  for (int64_t d : shape) {
    if (d < 0) fail("internal: negative output dimension in %s", shape_str(shape).c_str());
  }
  OrtValue* value = nullptr;
  check(OC_ORT(KernelContext_GetOutput)(raw_, i, shape.data(), shape.size(), &value));
  if (value == nullptr) fail("ONNX Runtime returned no buffer for output %zu", i);
  return describe(value);
}

namespace {
struct ParallelJob {
  const std::function<void(size_t)>* fn;
  std::atomic<bool> failed{false};
  std::mutex lock;
  std::string message;
  int code = OC_ORT_FAIL;
};

void run_task(void* user, size_t index) {
  auto* job = static_cast<ParallelJob*>(user);
  if (job->failed.load(std::memory_order_relaxed)) return;
  try {
    (*job->fn)(index);
  } catch (const Error& e) {
    std::lock_guard<std::mutex> guard(job->lock);
    if (!job->failed.exchange(true)) { job->message = e.what(); job->code = e.code; }
  } catch (const std::bad_alloc&) {
    std::lock_guard<std::mutex> guard(job->lock);
    if (!job->failed.exchange(true)) job->message = "out of memory";
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> guard(job->lock);
    if (!job->failed.exchange(true)) job->message = e.what();
  } catch (...) {  // never let anything escape into ORT's worker thread
    std::lock_guard<std::mutex> guard(job->lock);
    if (!job->failed.exchange(true)) job->message = "unknown C++ exception";
  }
}
}  // namespace

void Context::parallel_for(size_t total, const std::function<void(size_t)>& fn) const {
  if (total == 0) return;
  if (total == 1 || g_api.version < OC_SINCE_KernelContext_ParallelFor) {
    for (size_t i = 0; i < total; ++i) fn(i);
    return;
  }
  ParallelJob job;
  job.fn = &fn;
  check(OC_ORT(KernelContext_ParallelFor)(raw_, run_task, total, 0, &job));
  if (job.failed.load()) throw Error(job.message, job.code);
}

// ---- Attributes --------------------------------------------------------------------------------------
bool Attributes::get(const char* name, int64_t* out) const {
  OrtStatus* st = OC_ORT(KernelInfoGetAttribute_int64)(info_, name, out);
  if (st == nullptr) return true;
  OC_ORT(ReleaseStatus)(st);
  return false;
}

bool Attributes::get(const char* name, float* out) const {
  OrtStatus* st = OC_ORT(KernelInfoGetAttribute_float)(info_, name, out);
  if (st == nullptr) return true;
  OC_ORT(ReleaseStatus)(st);
  return false;
}

bool Attributes::get(const char* name, std::vector<int64_t>* out) const {
  size_t n = 0;
  OrtStatus* st = OC_ORT(KernelInfoGetAttributeArray_int64)(info_, name, nullptr, &n);
  if (st != nullptr) {
    OC_ORT(ReleaseStatus)(st);
    return false;
  }
  out->assign(n, 0);
  if (n == 0) return true;
  st = OC_ORT(KernelInfoGetAttributeArray_int64)(info_, name, out->data(), &n);
  if (st != nullptr) {
    OC_ORT(ReleaseStatus)(st);
    return false;
  }
  out->resize(n);
  return true;
}

int64_t Attributes::int_or(const char* name, int64_t fallback) const {
  int64_t v = 0;
  return get(name, &v) ? v : fallback;
}

float Attributes::float_or(const char* name, float fallback) const {
  float v = 0;
  return get(name, &v) ? v : fallback;
}

std::vector<int64_t> Attributes::ints(const char* name) const {
  std::vector<int64_t> v;
  if (!get(name, &v)) {
    fail("the node lacks the required attribute %s (INTS) (absent, or set with another type); "
         "fix: set it on the node, e.g. helper.make_node(..., %s=[...])", name, name);
  }
  return v;
}

float Attributes::float_required(const char* name) const {
  float v = 0;
  if (!get(name, &v)) {
    fail("the node lacks the required attribute %s (FLOAT) (absent, or set with another type); "
         "fix: set it on the node, e.g. helper.make_node(..., %s=1.0)", name, name);
  }
  return v;
}

// ---- InferContext ------------------------------------------------------------------------------------
TypeShape InferContext::input(size_t i) const {
  TypeShape ts;
  size_t count = 0;
  OrtStatus* st = OC_ORT(ShapeInferContext_GetInputCount)(raw_, &count);
  if (st != nullptr || i >= count) {
    if (st) OC_ORT(ReleaseStatus)(st);
    return ts;
  }
  OrtTensorTypeAndShapeInfo* info = nullptr;  // owned by the context
  st = OC_ORT(ShapeInferContext_GetInputTypeShape)(raw_, i, &info);
  if (st != nullptr || info == nullptr) {
    if (st) OC_ORT(ReleaseStatus)(st);
    return ts;
  }
  size_t rank = 0;
  check(OC_ORT(GetTensorElementType)(info, &ts.elem));
  check(OC_ORT(GetDimensionsCount)(info, &rank));
  ts.present = ts.elem != OC_ELEM_UNDEFINED;
  // An input of unknown rank reports rank 0 like a scalar (TensorTypeAndShape_HasShape does not
  // tell them apart here either), so rank 0 counts as unknown: we never claim a scalar output
  // we are not sure of; outputs computed from true scalars just get their shape at run time.
  ts.has_shape = rank > 0;
  if (!ts.has_shape) return ts;
  std::vector<int64_t> values(rank);
  std::vector<const char*> names(rank, nullptr);
  check(OC_ORT(GetDimensions)(info, values.data(), rank));
  check(OC_ORT(GetSymbolicDimensions)(info, names.data(), rank));
  ts.dims.resize(rank);
  for (size_t d = 0; d < rank; ++d) {
    ts.dims[d].value = values[d] >= 0 ? values[d] : -1;
    if (values[d] < 0 && names[d] != nullptr) ts.dims[d].symbol = names[d];
  }
  return ts;
}

static const OrtOpAttr* infer_attr(OrtShapeInferContext* raw, const char* name) {
  const OrtOpAttr* attr = nullptr;
  OrtStatus* st = OC_ORT(ShapeInferContext_GetAttribute)(raw, name, &attr);
  if (st != nullptr) {
    OC_ORT(ReleaseStatus)(st);
    return nullptr;
  }
  return attr;
}

bool InferContext::attr(const char* name, int64_t* out) const {
  const OrtOpAttr* a = infer_attr(raw_, name);
  size_t need = 0;
  if (a == nullptr) return false;
  OrtStatus* st = OC_ORT(ReadOpAttr)(a, OC_ATTR_INT, out, sizeof *out, &need);
  if (st != nullptr) OC_ORT(ReleaseStatus)(st);
  return st == nullptr;
}

bool InferContext::attr(const char* name, float* out) const {
  const OrtOpAttr* a = infer_attr(raw_, name);
  size_t need = 0;
  if (a == nullptr) return false;
  OrtStatus* st = OC_ORT(ReadOpAttr)(a, OC_ATTR_FLOAT, out, sizeof *out, &need);
  if (st != nullptr) OC_ORT(ReleaseStatus)(st);
  return st == nullptr;
}

bool InferContext::attr(const char* name, std::vector<int64_t>* out) const {
  const OrtOpAttr* a = infer_attr(raw_, name);
  if (a == nullptr) return false;
  size_t need = 0;
  OrtStatus* st = OC_ORT(ReadOpAttr)(a, OC_ATTR_INTS, nullptr, 0, &need);  // asks for the size
  if (st != nullptr) OC_ORT(ReleaseStatus)(st);
  out->assign(need / sizeof(int64_t), 0);
  if (need == 0) return true;
  st = OC_ORT(ReadOpAttr)(a, OC_ATTR_INTS, out->data(), need, &need);
  if (st != nullptr) {
    OC_ORT(ReleaseStatus)(st);
    return false;
  }
  return true;
}

void InferContext::set_output(size_t i, int elem, const std::vector<Dim>& dims) const {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  check(OC_ORT(CreateTensorTypeAndShapeInfo)(&info));
  std::vector<int64_t> values(dims.size());
  std::vector<const char*> names(dims.size());
  bool symbolic = false;
  // ORT stores a nameless unknown dim as dim_value -1 (and then warns that every run's real size
  // mismatches it), so unknown dims get a fresh name no other dim shares: unknown, not -1.
  static std::atomic<uint64_t> fresh{0};
  std::vector<std::string> made(dims.size());
  for (size_t d = 0; d < dims.size(); ++d) {
    values[d] = dims[d].is_known() ? dims[d].value : -1;
    if (!dims[d].is_known() && dims[d].symbol.empty()) {
      made[d] = "onnx_custom_unk__" + std::to_string(fresh.fetch_add(1));
    }
    names[d] = dims[d].is_known() ? "" : (made[d].empty() ? dims[d].symbol.c_str() : made[d].c_str());
    symbolic = symbolic || !dims[d].is_known();
  }
  OrtStatus* st = OC_ORT(SetTensorElementType)(info, elem);
  if (st == nullptr) st = OC_ORT(SetDimensions)(info, values.data(), values.size());
  if (st == nullptr && symbolic) st = OC_ORT(SetSymbolicDimensions)(info, names.data(), names.size());
  if (st == nullptr) st = OC_ORT(ShapeInferContext_SetOutputTypeShape)(raw_, i, info);
  OC_ORT(ReleaseTensorTypeAndShapeInfo)(info);
  check(st);
}

// ---- shared checks -----------------------------------------------------------------------------------
void require_dtype(const char* what, const Tensor& t, const std::vector<int>& allowed) {
  for (int e : allowed) {
    if (t.elem == e) return;
  }
  fail("%s has dtype %s; expected one of %s; fix: cast it (e.g. with a Cast node)", what,
       elem_name(t.elem), elem_list(allowed).c_str());
}

void require_same_dtype(const char* what, const Tensor& t, const char* ref_name,
                        const Tensor& ref) {
  if (t.elem != ref.elem) {
    fail("%s has dtype %s but %s has %s; expected one dtype for both; fix: cast one of them",
         what, elem_name(t.elem), ref_name, elem_name(ref.elem));
  }
}

void require_rank(const char* what, const Tensor& t, size_t rank, const char* layout) {
  if (t.rank() != rank) {
    fail("%s must be %zu-D %s; received shape %s", what, rank, layout, shape_str(t.shape).c_str());
  }
}

}  // namespace oc
