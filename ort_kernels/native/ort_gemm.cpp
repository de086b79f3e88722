// OrtGemm: ORT's built-in Gemm through CreateOp/InvokeOp, on OrtValues wrapping our buffers.
#include "ort_gemm.h"

#include <cstdlib>
#include <cstring>

namespace oc {

GemmBackend choose_gemm(GemmBackend preferred) {
  const char* choice = std::getenv("ONNX_CUSTOM_NATIVE_GEMM");
  if (choice != nullptr && std::strcmp(choice, "ort") == 0) return GemmBackend::ort;
  if (choice != nullptr && std::strcmp(choice, "own") == 0) return GemmBackend::own;
  return preferred;
}

std::unique_ptr<OrtGemm> make_ort_gemm(GemmBackend backend, const OrtKernelInfo* info, bool trans_b) {
  if (backend != GemmBackend::ort) return nullptr;
  try {
    return std::make_unique<OrtGemm>(info, trans_b);
  } catch (const Error&) {
    return nullptr;  // e.g. a minimal ONNX Runtime build without CreateOp: our GEMM serves
  }
}

OrtGemm::OrtGemm(const OrtKernelInfo* info, bool trans_b) : trans_b_(trans_b) {
  // CreateOp applies no schema defaults: every attribute Gemm reads must be given. ORT reads INT
  // attributes as int64 (older releases as int: on little-endian the same bytes).
  const int64_t trans_a_value = 0, trans_b_value = trans_b ? 1 : 0;
  const float one = 1.0f;
  struct Spec { const char* name; const void* value; int type; };
  const Spec specs[] = {{"transA", &trans_a_value, OC_ATTR_INT},
                        {"transB", &trans_b_value, OC_ATTR_INT},
                        {"alpha", &one, OC_ATTR_FLOAT},
                        {"beta", &one, OC_ATTR_FLOAT}};
  OrtOpAttr* attrs[4] = {nullptr, nullptr, nullptr, nullptr};
  OrtStatus* st = nullptr;
  for (int i = 0; i < 4 && st == nullptr; ++i) {
    st = OC_ORT(CreateOpAttr)(specs[i].name, specs[i].value, 1, specs[i].type, &attrs[i]);
  }
  const char* type_names[] = {"T"};
  const int type_values[] = {OC_ELEM_FLOAT};
  if (st == nullptr) {
    st = OC_ORT(CreateOp)(info, "Gemm", "", 13, type_names, type_values, 1, attrs, 4, 3, 1, &op_);
  }
  for (OrtOpAttr* a : attrs) {
    if (a != nullptr) OC_ORT(ReleaseOpAttr)(a);
  }
  check(st);
  st = OC_ORT(CreateCpuMemoryInfo)(OC_DEVICE_ALLOCATOR, OC_MEM_TYPE_DEFAULT, &cpu_);
  if (st != nullptr) {
    OC_ORT(ReleaseOp)(op_);
    check(st);
  }
}

OrtGemm::~OrtGemm() {
  if (op_ != nullptr) OC_ORT(ReleaseOp)(op_);
  if (cpu_ != nullptr) OC_ORT(ReleaseMemoryInfo)(cpu_);
}

namespace {
// An OrtValue viewing `data` (no copy); released by the destructor.
struct View {
  OrtValue* value = nullptr;
  View(const OrtMemoryInfo* cpu, const float* data, int64_t rows, int64_t cols) {
    const int64_t shape[2] = {rows, cols};
    check(OC_ORT(CreateTensorWithDataAsOrtValue)(cpu, const_cast<float*>(data),
                                                 static_cast<size_t>(rows * cols) * sizeof(float),
                                                 shape, 2, OC_ELEM_FLOAT, &value));
  }
  ~View() { OC_ORT(ReleaseValue)(value); }
  View(const View&) = delete;
  View& operator=(const View&) = delete;
};
}  // namespace

void OrtGemm::run(const OrtKernelContext* ctx, const float* a, const float* b, const float* c,
                  bool c_per_row, float* y, int64_t M, int64_t N, int64_t K) const {
  View va(cpu_, a, M, K);
  View vb(cpu_, b, trans_b_ ? N : K, trans_b_ ? K : N);
  View vc(cpu_, c, c_per_row ? M : 1, c_per_row ? 1 : N);
  View vy(cpu_, y, M, N);
  const OrtValue* inputs[] = {va.value, vb.value, vc.value};
  OrtValue* outputs[] = {vy.value};
  check(OC_ORT(InvokeOp)(ctx, op_, inputs, 3, outputs, 1));
}

}  // namespace oc
