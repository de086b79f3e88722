// Blocked GEMM in the BLIS style: B is packed into kc x NR strips (one stays in L1 while a
// micro-kernel runs), A into MR x kc strips (a block of them stays in L2), and an MR x NR tile of
// C lives in registers for the whole kc loop. The x86 micro-kernels are compiled with target
// attributes and picked at run time, so one library binary runs on any x86-64 CPU.
#include "gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define OC_X86 1
#endif

namespace oc {
namespace {

constexpr int64_t KC = 256;   // depth of one packed block
constexpr int64_t NC = 3072;  // columns of B packed at once

enum class Isa { generic, avx2, avx512 };

Isa detect_isa() {
  Isa best = Isa::generic;
#ifdef OC_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = Isa::avx2;
  if (__builtin_cpu_supports("avx512f")) best = Isa::avx512;
#endif
  const char* cap = std::getenv("ONNX_CUSTOM_NATIVE_ISA");
  if (cap != nullptr) {
    if (std::strcmp(cap, "generic") == 0) best = Isa::generic;
    if (std::strcmp(cap, "avx2") == 0 && best == Isa::avx512) best = Isa::avx2;
  }
  return best;
}

Isa isa() {
  static const Isa chosen = detect_isa();
  return chosen;
}

// A[i, k] for rows [0, mc) and depth [0, kc) into MR-row strips: strip s holds, for each k, the
// MR values A[s*MR + r, k] (zero past mc).
template <typename T, int MR>
void pack_a_block(const T* a, int64_t rs, int64_t cs, int64_t mc, int64_t kc, T* dst) {
  for (int64_t s = 0; s < mc; s += MR) {
    const int64_t rows = std::min<int64_t>(MR, mc - s);
    for (int64_t k = 0; k < kc; ++k) {
      for (int64_t r = 0; r < rows; ++r) dst[r] = a[(s + r) * rs + k * cs];
      for (int64_t r = rows; r < MR; ++r) dst[r] = T(0);
      dst += MR;
    }
  }
}

// B[k, j] for depth [0, kc) and columns [0, nc) into NR-column strips (zero past nc).
template <typename T, int NR>
void pack_b_block(const T* b, int64_t rs, int64_t cs, int64_t kc, int64_t nc, T* dst) {
  for (int64_t s = 0; s < nc; s += NR) {
    const int64_t cols = std::min<int64_t>(NR, nc - s);
    if (cs == 1 && cols == NR) {
      for (int64_t k = 0; k < kc; ++k, dst += NR) std::memcpy(dst, b + k * rs + s, NR * sizeof(T));
      continue;
    }
    if (rs == 1) {  // transposed B (e.g. a weight [N, K]): read each column's run contiguously
      for (int64_t j = 0; j < NR; ++j) {
        const T* src = b + (s + j) * cs;
        if (j < cols) {
          for (int64_t k = 0; k < kc; ++k) dst[k * NR + j] = src[k];
        } else {
          for (int64_t k = 0; k < kc; ++k) dst[k * NR + j] = T(0);
        }
      }
      dst += kc * NR;
      continue;
    }
    for (int64_t k = 0; k < kc; ++k, dst += NR) {
      for (int64_t j = 0; j < cols; ++j) dst[j] = b[k * rs + (s + j) * cs];
      for (int64_t j = cols; j < NR; ++j) dst[j] = T(0);
    }
  }
}

// Writes an MR x NR register tile (held in `tile`, row-major) into C (only mr x nr valid).
template <typename T, int MR, int NR>
inline void store_tile(const T* tile, T* c, int64_t ldc, int64_t mr, int64_t nr, bool acc) {
  for (int64_t r = 0; r < mr; ++r) {
    for (int64_t j = 0; j < nr; ++j) c[r * ldc + j] = (acc ? c[r * ldc + j] : T(0)) + tile[r * NR + j];
  }
}

template <typename T, int MR, int NR>
void kernel_generic(int64_t kc, const T* ap, const T* bp, T* c, int64_t ldc, int64_t mr,
                    int64_t nr, bool acc) {
  T tile[MR * NR] = {};
  for (int64_t k = 0; k < kc; ++k, ap += MR, bp += NR) {
    for (int r = 0; r < MR; ++r) {
      const T av = ap[r];
      for (int j = 0; j < NR; ++j) tile[r * NR + j] += av * bp[j];
    }
  }
  store_tile<T, MR, NR>(tile, c, ldc, mr, nr, acc);
}

#ifdef OC_X86
// 6 x 16 floats: 12 accumulators of 8 lanes, 2 B loads and 6 broadcasts per k.
__attribute__((target("avx2,fma"))) void kernel_avx2(int64_t kc, const float* ap, const float* bp,
                                                     float* c, int64_t ldc, int64_t mr,
                                                     int64_t nr, bool acc) {
  constexpr int MR = 6, NR = 16;
  __m256 t[MR][2];
  for (int r = 0; r < MR; ++r) t[r][0] = t[r][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < kc; ++k, ap += MR, bp += NR) {
    const __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
    for (int r = 0; r < MR; ++r) {
      const __m256 av = _mm256_broadcast_ss(ap + r);
      t[r][0] = _mm256_fmadd_ps(av, b0, t[r][0]);
      t[r][1] = _mm256_fmadd_ps(av, b1, t[r][1]);
    }
  }
  if (mr == MR && nr == NR) {
    for (int r = 0; r < MR; ++r) {
      float* row = c + r * ldc;
      __m256 v0 = t[r][0], v1 = t[r][1];
      if (acc) {
        v0 = _mm256_add_ps(v0, _mm256_loadu_ps(row));
        v1 = _mm256_add_ps(v1, _mm256_loadu_ps(row + 8));
      }
      _mm256_storeu_ps(row, v0);
      _mm256_storeu_ps(row + 8, v1);
    }
    return;
  }
  alignas(32) float tile[MR * NR];
  for (int r = 0; r < MR; ++r) {
    _mm256_store_ps(tile + r * NR, t[r][0]);
    _mm256_store_ps(tile + r * NR + 8, t[r][1]);
  }
  store_tile<float, MR, NR>(tile, c, ldc, mr, nr, acc);
}

// 8 x 32 floats: 16 accumulators of 16 lanes (channel counts are usually multiples of 8).
__attribute__((target("avx512f"))) void kernel_avx512(int64_t kc, const float* ap,
                                                      const float* bp, float* c, int64_t ldc,
                                                      int64_t mr, int64_t nr, bool acc) {
  constexpr int MR = 8, NR = 32;
  __m512 t[MR][2];
  for (int r = 0; r < MR; ++r) t[r][0] = t[r][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; ++k, ap += MR, bp += NR) {
    const __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
    for (int r = 0; r < MR; ++r) {
      const __m512 av = _mm512_set1_ps(ap[r]);
      t[r][0] = _mm512_fmadd_ps(av, b0, t[r][0]);
      t[r][1] = _mm512_fmadd_ps(av, b1, t[r][1]);
    }
  }
  if (mr == MR && nr == NR) {
    for (int r = 0; r < MR; ++r) {
      float* row = c + r * ldc;
      __m512 v0 = t[r][0], v1 = t[r][1];
      if (acc) {
        v0 = _mm512_add_ps(v0, _mm512_loadu_ps(row));
        v1 = _mm512_add_ps(v1, _mm512_loadu_ps(row + 16));
      }
      _mm512_storeu_ps(row, v0);
      _mm512_storeu_ps(row + 16, v1);
    }
    return;
  }
  alignas(64) float tile[MR * NR];
  for (int r = 0; r < MR; ++r) {
    _mm512_store_ps(tile + r * NR, t[r][0]);
    _mm512_store_ps(tile + r * NR + 16, t[r][1]);
  }
  store_tile<float, MR, NR>(tile, c, ldc, mr, nr, acc);
}
#endif

template <typename T>
using MicroKernel = void (*)(int64_t, const T*, const T*, T*, int64_t, int64_t, int64_t, bool);

template <typename T>
struct Micro {
  int64_t mr, nr;
  MicroKernel<T> fn;
};

template <typename T>
Micro<T> kernel_for() {
  if constexpr (std::is_same_v<T, double>) {
    return {4, 8, kernel_generic<double, 4, 8>};
  } else {
    switch (isa()) {
#ifdef OC_X86
      case Isa::avx512: return {8, 32, kernel_avx512};
      case Isa::avx2: return {6, 16, kernel_avx2};
#endif
      default: return {4, 16, kernel_generic<float, 4, 16>};
    }
  }
}

template <typename T>
const Micro<T>& active() {
  static const Micro<T> k = kernel_for<T>();
  return k;
}

// Zero C's M x N block (a GEMM of depth 0 that does not accumulate).
template <typename T>
void zero_block(int64_t M, int64_t N, T* c, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) std::fill(c + i * ldc, c + i * ldc + N, T(0));
}

template <typename T, int MR, int NR>
void drive(MicroKernel<T> kernel, int64_t M, int64_t N, int64_t K, const T* a, int64_t a_rs,
           int64_t a_cs, const T* b, int64_t b_rs, int64_t b_cs, T* c, int64_t ldc,
           bool accumulate) {
  constexpr int64_t MC = MR * 16;
  // Packing buffers are per thread and reused across calls (they only grow).
  thread_local std::vector<T> a_pack, b_pack;
  const int64_t nc_max = std::min(NC, (N + NR - 1) / NR * NR);
  const int64_t kc_max = std::min(KC, K);
  if (static_cast<int64_t>(b_pack.size()) < nc_max * kc_max) b_pack.resize(nc_max * kc_max);
  if (static_cast<int64_t>(a_pack.size()) < MC * kc_max) a_pack.resize(MC * kc_max);
  for (int64_t jc = 0; jc < N; jc += NC) {
    const int64_t nc = std::min(NC, N - jc);
    for (int64_t pc = 0; pc < K; pc += KC) {
      const int64_t kc = std::min(KC, K - pc);
      pack_b_block<T, NR>(b + pc * b_rs + jc * b_cs, b_rs, b_cs, kc, nc, b_pack.data());
      const bool acc = accumulate || pc > 0;
      for (int64_t ic = 0; ic < M; ic += MC) {
        const int64_t mc = std::min(MC, M - ic);
        pack_a_block<T, MR>(a + ic * a_rs + pc * a_cs, a_rs, a_cs, mc, kc, a_pack.data());
        for (int64_t jr = 0; jr < nc; jr += NR) {
          for (int64_t ir = 0; ir < mc; ir += MR) {
            kernel(kc, a_pack.data() + ir * kc, b_pack.data() + jr * kc,
                   c + (ic + ir) * ldc + jc + jr, ldc, std::min<int64_t>(MR, mc - ir),
                   std::min<int64_t>(NR, nc - jr), acc);
          }
        }
      }
    }
  }
}

template <typename T>
void gemm_any(int64_t M, int64_t N, int64_t K, const T* a, int64_t a_rs, int64_t a_cs,
              const T* b, int64_t b_rs, int64_t b_cs, T* c, int64_t ldc, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    if (!accumulate) zero_block(M, N, c, ldc);
    return;
  }
  const Micro<T>& k = active<T>();
  if constexpr (std::is_same_v<T, double>) {
    drive<double, 4, 8>(k.fn, M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, accumulate);
  } else {
    switch (k.nr) {
      case 32: return drive<float, 8, 32>(k.fn, M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, accumulate);
      case 16:
        if (k.mr == 6) return drive<float, 6, 16>(k.fn, M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, accumulate);
        return drive<float, 4, 16>(k.fn, M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, accumulate);
      default: break;
    }
  }
}

}  // namespace

void gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t a_rs, int64_t a_cs,
          const float* b, int64_t b_rs, int64_t b_cs, float* c, int64_t ldc, bool accumulate) {
  gemm_any(M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, accumulate);
}

void gemm(int64_t M, int64_t N, int64_t K, const double* a, int64_t a_rs, int64_t a_cs,
          const double* b, int64_t b_rs, int64_t b_cs, double* c, int64_t ldc, bool accumulate) {
  gemm_any(M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, accumulate);
}

template <typename T>
int64_t gemm_nr() {
  return active<T>().nr;
}

template <typename T>
int64_t gemm_mr() {
  return active<T>().mr;
}

template <typename T>
size_t packed_a_size(int64_t M, int64_t K) {
  const int64_t mr = gemm_mr<T>();
  return static_cast<size_t>((M + mr - 1) / mr * mr * std::max<int64_t>(K, 0));
}

template <typename T>
void pack_a(const T* a, int64_t lda, int64_t M, int64_t K, T* dst) {
  const int64_t mr = gemm_mr<T>();
  for (int64_t s = 0; s < M; s += mr) {
    const int64_t rows = std::min(mr, M - s);
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t r = 0; r < rows; ++r) dst[r] = a[(s + r) * lda + k];
      for (int64_t r = rows; r < mr; ++r) dst[r] = T(0);
      dst += mr;
    }
  }
}

template <typename T>
void gemm_packed(int64_t M, int64_t N, int64_t K, const T* a_packed, const T* b_packed, T* c,
                 int64_t ldc, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    if (!accumulate) zero_block(M, N, c, ldc);
    return;
  }
  const Micro<T>& k = active<T>();
  // one B strip stays in cache while every A strip passes over it
  for (int64_t j = 0; j < N; j += k.nr) {
    const T* b = b_packed + (j / k.nr) * k.nr * K;
    for (int64_t i = 0; i < M; i += k.mr) {
      k.fn(K, a_packed + (i / k.mr) * k.mr * K, b, c + i * ldc + j, ldc, std::min(k.mr, M - i),
           std::min(k.nr, N - j), accumulate);
    }
  }
}

template int64_t gemm_nr<float>();
template int64_t gemm_nr<double>();
template int64_t gemm_mr<float>();
template int64_t gemm_mr<double>();
template size_t packed_a_size<float>(int64_t, int64_t);
template size_t packed_a_size<double>(int64_t, int64_t);
template void pack_a<float>(const float*, int64_t, int64_t, int64_t, float*);
template void pack_a<double>(const double*, int64_t, int64_t, int64_t, double*);
template void gemm_packed<float>(int64_t, int64_t, int64_t, const float*, const float*, float*,
                                 int64_t, bool);
template void gemm_packed<double>(int64_t, int64_t, int64_t, const double*, const double*,
                                  double*, int64_t, bool);

const char* gemm_isa() {
  switch (isa()) {
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    default: return "generic";
  }
}

}  // namespace oc
