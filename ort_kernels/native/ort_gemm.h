// ONNX Runtime's own float32 Gemm (MLAS), called from inside our kernels through the C API's
// CreateOp/InvokeOp ("calling a native operator from a custom operator"). One of the two GEMM
// back ends the kernels can use; see choose_gemm() for which one runs.
#pragma once

#include "common.h"

namespace oc {

enum class GemmBackend { own, ort };

// The back end for a kernel being created: `preferred` (each kernel's measured best, see
// benchmarks/native_ops.py) unless ONNX_CUSTOM_NATIVE_GEMM=own|ort says otherwise (read at kernel
// creation, so benchmarks and tests can run both in one process).
GemmBackend choose_gemm(GemmBackend preferred);

// ORT's Gemm for a kernel being created, or nullptr when `backend` is ours or this ONNX Runtime
// cannot create it (CreateOp unavailable): the caller then uses our GEMM.
std::unique_ptr<class OrtGemm> make_ort_gemm(GemmBackend backend, const OrtKernelInfo* info,
                                             bool trans_b);

class OrtGemm {
 public:
  // Gemm(A, B, C) with transB as given, alpha = beta = 1, float32; created once per kernel.
  OrtGemm(const OrtKernelInfo* info, bool trans_b);
  ~OrtGemm();
  OrtGemm(const OrtGemm&) = delete;
  OrtGemm& operator=(const OrtGemm&) = delete;

  // y[M, N] = a[M, K] * (trans_b ? b[N, K]^T : b[K, N]) + c[N] (or c[M, 1] when c_per_row),
  // all contiguous row-major; y may be any writable buffer of M * N floats.
  void run(const OrtKernelContext* ctx, const float* a, const float* b, const float* c,
           bool c_per_row, float* y, int64_t M, int64_t N, int64_t K) const;

 private:
  bool trans_b_;
  OrtOp* op_ = nullptr;
  OrtMemoryInfo* cpu_ = nullptr;
};

}  // namespace oc
