// Our own single-threaded blocked GEMM: packed panels and register-blocked micro-kernels chosen
// at run time (AVX-512, AVX2+FMA or portable C++). Callers split the work across threads.
#pragma once

#include <cstddef>
#include <cstdint>

namespace oc {

// C[i, j] (row stride ldc) = (accumulate ? C[i, j] : 0) + sum_k A[i, k] * B[k, j] where
// A[i, k] = a[i * a_rs + k * a_cs] and B[k, j] = b[k * b_rs + j * b_cs] (any strides, so
// transposed operands need no copy), for i < M, j < N, k < K. Packs both operands internally.
void gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t a_rs, int64_t a_cs,
          const float* b, int64_t b_rs, int64_t b_cs, float* c, int64_t ldc, bool accumulate);
void gemm(int64_t M, int64_t N, int64_t K, const double* a, int64_t a_rs, int64_t a_cs,
          const double* b, int64_t b_rs, int64_t b_cs, double* c, int64_t ldc, bool accumulate);

// Pre-packed operands, for callers that produce B themselves (DCN's im2col writes its columns
// straight into this layout, and packs its weights once per call):
//  - packed B: column strips of width gemm_nr<T>(); strip s holds, for k in [0, K), the values
//    B[k, s * NR .. s * NR + NR) contiguously (columns past N are zero);
//  - packed A: from pack_a(), row strips of gemm_mr<T>() rows over the whole depth K.
template <typename T>
int64_t gemm_nr();
template <typename T>
int64_t gemm_mr();
// Elements pack_a needs for an M x K matrix.
template <typename T>
size_t packed_a_size(int64_t M, int64_t K);
template <typename T>
void pack_a(const T* a, int64_t lda, int64_t M, int64_t K, T* dst);
template <typename T>
void gemm_packed(int64_t M, int64_t N, int64_t K, const T* a_packed, const T* b_packed, T* c,
                 int64_t ldc, bool accumulate);

// Instruction set the float kernels use: "avx512", "avx2" or "generic". The environment variable
// ONNX_CUSTOM_NATIVE_ISA ("avx2" or "generic") caps it, to test every path on one machine.
const char* gemm_isa();

}  // namespace oc
