// Entry point of libonnx_custom_ops.so: RegisterCustomOps (ONNX Runtime's custom-op library
// protocol) and the glue between oc::OpDef and ORT's OcCustomOp callbacks. Nothing here links
// against ONNX Runtime: every ORT function comes from the OrtApiBase ORT hands us.
#include <algorithm>
#include <climits>
#include <cstdio>
#include <map>
#include <mutex>
#include <new>

#include "common.h"

#define OC_EXPORT extern "C" __attribute__((visibility("default")))

// A library built from user op specs (onnx_custom.spec.native_library) names itself and reads its
// own session config entry, so it loads beside libonnx_custom_ops.so in one session.
#ifndef OC_LIBRARY_NAME
#define OC_LIBRARY_NAME "libonnx_custom_ops"
#endif
#ifndef OC_DOMAINS_KEY
#define OC_DOMAINS_KEY "onnx_custom.native.domains"
#endif

namespace oc {
namespace {

// One per op; ORT keeps pointers to it for as long as sessions live, so it is never freed.
struct NativeOp {
  OcCustomOp abi;  // must stay first: ORT hands &abi back to the callbacks
  const OpDef* def;
  std::string qualname;  // "onnx_custom::DeformConv2d"
};

struct KernelBox {
  std::unique_ptr<Kernel> kernel;
  std::string where;  // "onnx_custom::DeformConv2d (node 'dcn0')" for error messages
};

const NativeOp* self(const OcCustomOp* op) { return reinterpret_cast<const NativeOp*>(op); }

OrtStatus* to_status(const std::string& where, const char* stage, int code, const char* what) {
  return make_status(code, "onnx-custom native kernel " + where + " " + stage + ": " + what);
}

// Runs fn, turning any exception into an ORT status (never lets one cross into ORT).
template <typename Fn>
OrtStatus* guarded(const std::string& where, const char* stage, Fn&& fn) {
  try {
    fn();
    return nullptr;
  } catch (const Error& e) {
    return to_status(where, stage, e.code, e.what());
  } catch (const std::bad_alloc&) {
    return to_status(where, stage, OC_ORT_FAIL, "out of memory");
  } catch (const std::exception& e) {
    return to_status(where, stage, OC_ORT_FAIL, e.what());
  } catch (...) {
    return to_status(where, stage, OC_ORT_FAIL, "unknown C++ exception");
  }
}

std::string node_name(const OrtKernelInfo* info) {
  size_t size = 0;
  OrtStatus* st = OC_ORT(KernelInfo_GetNodeName)(info, nullptr, &size);
  if (st != nullptr) {
    OC_ORT(ReleaseStatus)(st);
    return std::string();
  }
  std::string name(size, '\0');
  st = OC_ORT(KernelInfo_GetNodeName)(info, name.data(), &size);
  if (st != nullptr) {
    OC_ORT(ReleaseStatus)(st);
    return std::string();
  }
  name.resize(size ? size - 1 : 0);  // size counts the terminating NUL
  return name;
}

const char* op_name(const OcCustomOp* op) { return self(op)->def->name; }
const char* op_provider(const OcCustomOp*) { return "CPUExecutionProvider"; }
int op_input_type(const OcCustomOp* op, size_t i) {
  const auto& v = self(op)->def->input_types;
  return i < v.size() ? v[i] : OC_ELEM_UNDEFINED;
}
int op_output_type(const OcCustomOp* op, size_t i) {
  const auto& v = self(op)->def->output_types;
  return i < v.size() ? v[i] : OC_ELEM_UNDEFINED;
}
size_t op_input_count(const OcCustomOp* op) { return self(op)->def->inputs.size(); }
size_t op_output_count(const OcCustomOp* op) { return self(op)->def->outputs.size(); }
int op_input_kind(const OcCustomOp* op, size_t i) {
  const auto& v = self(op)->def->inputs;
  return i < v.size() ? v[i] : OC_IO_REQUIRED;
}
int op_output_kind(const OcCustomOp* op, size_t i) {
  const auto& v = self(op)->def->outputs;
  return i < v.size() ? v[i] : OC_IO_REQUIRED;
}
int op_memory_default(const OcCustomOp*, size_t) { return OC_MEM_TYPE_DEFAULT; }
int op_one(const OcCustomOp*) { return 1; }
int op_zero(const OcCustomOp*) { return 0; }
int op_last_version(const OcCustomOp*) { return INT_MAX; }
size_t op_no_pairs(int** a, int** b) {
  *a = nullptr;
  *b = nullptr;
  return 0;
}
void op_release_pairs(int*, int*) {}
void* op_create_v1(const OcCustomOp*, const void*, const OrtKernelInfo*) { return nullptr; }
void op_compute_v1(void*, OrtKernelContext*) {}

OrtStatus* op_create(const OcCustomOp* op, const void*, const OrtKernelInfo* info, void** out) {
  *out = nullptr;
  const NativeOp* n = self(op);
  auto box = std::make_unique<KernelBox>();
  const std::string node = node_name(info);
  box->where = n->qualname + (node.empty() ? std::string() : " (node '" + node + "')");
  OrtStatus* st = guarded(box->where, "creation", [&] {
    box->kernel = n->def->create(Attributes(info));
  });
  if (st == nullptr) *out = box.release();
  return st;
}

OrtStatus* op_compute(void* kernel, OrtKernelContext* raw) {
  auto* box = static_cast<KernelBox*>(kernel);
  if (box == nullptr) return make_status(OC_ORT_FAIL, "onnx-custom native kernel: not created");
  return guarded(box->where, "failed", [&] {
    Context ctx(raw);
    box->kernel->compute(ctx);
  });
}

void op_destroy(void* kernel) { delete static_cast<KernelBox*>(kernel); }

OrtStatus* op_infer(const OcCustomOp* op, OrtShapeInferContext* raw) {
  const NativeOp* n = self(op);
  return guarded(n->qualname, "shape inference", [&] { n->def->infer(InferContext(raw)); });
}

NativeOp* make_native(const OpDef& def) {
  auto* n = new NativeOp();
  n->def = &def;
  n->qualname = std::string(def.domain) + "::" + def.name;
  OcCustomOp& a = n->abi;
  a.version = OC_CUSTOM_OP_VERSION;
  a.CreateKernel = op_create_v1;
  a.GetName = op_name;
  a.GetExecutionProviderType = op_provider;
  a.GetInputType = op_input_type;
  a.GetInputTypeCount = op_input_count;
  a.GetOutputType = op_output_type;
  a.GetOutputTypeCount = op_output_count;
  a.KernelCompute = op_compute_v1;
  a.KernelDestroy = op_destroy;
  a.GetInputCharacteristic = op_input_kind;
  a.GetOutputCharacteristic = op_output_kind;
  a.GetInputMemoryType = op_memory_default;
  a.GetVariadicInputMinArity = op_one;
  a.GetVariadicInputHomogeneity = op_zero;
  a.GetVariadicOutputMinArity = op_one;
  a.GetVariadicOutputHomogeneity = op_zero;
  a.CreateKernelV2 = op_create;
  a.KernelComputeV2 = op_compute;
  a.InferOutputShapeFn = op_infer;
  a.GetStartVersion = op_one;
  a.GetEndVersion = op_last_version;
  a.GetMayInplace = op_no_pairs;
  a.ReleaseMayInplace = op_release_pairs;
  a.GetAliasMap = op_no_pairs;
  a.ReleaseAliasMap = op_release_pairs;
  return n;
}

// Domains named by the session config entry "onnx_custom.native.domains" (comma separated;
// absent or empty: all). ORT accepts one definition per domain and session, so a caller that
// serves some domain with other kernels (e.g. onnx-custom's Python ones) leaves it out here.
std::vector<std::string> selected_domains(const OrtSessionOptions* options) {
  static const char* const key = OC_DOMAINS_KEY;
  std::vector<std::string> out;
  int has = 0;
  check(OC_ORT(HasSessionConfigEntry)(options, key, &has));
  if (!has) return out;
  size_t size = 0;
  OrtStatus* st = OC_ORT(GetSessionConfigEntry)(options, key, nullptr, &size);
  if (st != nullptr) OC_ORT(ReleaseStatus)(st);  // asked for the size only
  std::string value(size, '\0');
  check(OC_ORT(GetSessionConfigEntry)(options, key, value.data(), &size));
  value.resize(size ? size - 1 : 0);
  size_t start = 0;
  while (start <= value.size()) {
    const size_t comma = std::min(value.find(',', start), value.size());
    if (comma > start) out.push_back(value.substr(start, comma - start));
    start = comma + 1;
  }
  if (out.empty()) out.push_back(std::string());  // "": no domain at all
  for (const std::string& d : out) {
    bool known = d.empty();
    for (const OpDef& def : all_ops()) known = known || d == def.domain;
    if (!known) {
      std::string served;
      for (const OpDef& def : all_ops()) {
        if (served.find(def.domain) == std::string::npos) served += (served.empty() ? "" : ", ") + std::string(def.domain);
      }
      throw Error("session config entry " + std::string(key) + " names domain '" + d +
                  "', which this library does not serve; expected a comma-separated subset of " +
                  served);
    }
  }
  return out;
}

std::mutex g_lock;
std::map<std::string, OrtCustomOpDomain*>* g_domains = nullptr;  // built once, never freed

// Newest OrtApi version first; the library needs at least 17 (shape inference, ParallelFor).
constexpr int kNewestApi = 31;
constexpr int kOldestApi = 17;

}  // namespace

const std::vector<OpDef>& all_ops() {
  static const std::vector<OpDef> ops = [] {
    std::vector<OpDef> v;
#ifndef OC_WITHOUT_SHIPPED_OPS
    add_seed_ops(v);
    add_multi_out3_ops(v);
    add_deform_conv_ops(v);
    add_bev_pool_ops(v);
    add_custom_linear_ops(v);
    add_msda_ops(v);
#endif
#ifdef OC_WITH_USER_OPS
    add_user_ops(v);  // generated by onnx_custom.spec.native_library from the user's op specs
#endif
    return v;
  }();
  return ops;
}

}  // namespace oc

// ONNX Runtime calls this when a session's options load the library (register_custom_ops_library
// in Python, RegisterCustomOpsLibrary_V2 in C, and the other language bindings).
OC_EXPORT OrtStatus* RegisterCustomOps(OrtSessionOptions* options, const OcOrtApiBase* base) {
  using namespace oc;
  std::lock_guard<std::mutex> guard(g_lock);
  if (g_api.table == nullptr) {
    for (int v = kNewestApi; v >= kOldestApi && g_api.table == nullptr; --v) {
      g_api.table = base->GetApi(static_cast<uint32_t>(v));
      g_api.version = g_api.table ? v : 0;
    }
    if (g_api.table == nullptr) {
      // Too old to create a status through; ORT 1.17 or newer is required.
      std::fprintf(stderr, OC_LIBRARY_NAME ": ONNX Runtime %s is too old (need >= 1.17)\n",
                   base->GetVersionString());
      return nullptr;
    }
  }
  try {
    if (g_domains == nullptr) {
      auto* domains = new std::map<std::string, OrtCustomOpDomain*>();
      for (const OpDef& def : all_ops()) {
        OrtCustomOpDomain*& dom = (*domains)[def.domain];
        if (dom == nullptr) check(OC_ORT(CreateCustomOpDomain)(def.domain, &dom));
        check(OC_ORT(CustomOpDomain_Add)(dom, &make_native(def)->abi));
      }
      g_domains = domains;
    }
    const std::vector<std::string> wanted = selected_domains(options);
    for (auto& entry : *g_domains) {
      if (wanted.empty() || std::find(wanted.begin(), wanted.end(), entry.first) != wanted.end()) {
        check(OC_ORT(AddCustomOpDomain)(options, entry.second));
      }
    }
  } catch (const Error& e) {
    return make_status(e.code, std::string(OC_LIBRARY_NAME ": registration failed: ") + e.what());
  } catch (const std::exception& e) {
    return make_status(OC_ORT_FAIL, std::string(OC_LIBRARY_NAME ": registration failed: ") + e.what());
  }
  return nullptr;
}

// "onnx_custom::my_add,onnx_custom::multi_out,...": what this library serves (for tools and tests).
OC_EXPORT const char* OnnxCustomNativeOps(void) {
  static const std::string names = [] {
    std::string s;
    for (const oc::OpDef& def : oc::all_ops()) {
      if (!s.empty()) s += ",";
      s += std::string(def.domain) + "::" + def.name;
    }
    return s;
  }();
  return names.c_str();
}
