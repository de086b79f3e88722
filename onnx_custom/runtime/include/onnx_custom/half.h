// IEEE half (float16) and bfloat16 <-> float conversions, rounding to nearest even like numpy and
// torch. Header-only, no dependencies: shared by the native kernel library (ort_kernels/native)
// and the user kernel API (onnx_custom/kernel.h).
#pragma once

#include <cstdint>
#include <cstring>

namespace onnx_custom {

inline float half_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h & 0x7fffu) << 13;
  const uint32_t exp = u & (0x7c00u << 13);
  u += (127u - 15u) << 23;
  if (exp == (0x7c00u << 13)) {
    u += (128u - 16u) << 23;  // Inf / NaN
  } else if (exp == 0) {      // zero / subnormal: renormalize through float arithmetic
    u += 1u << 23;
    float f;
    std::memcpy(&f, &u, 4);
    f -= 6.103515625e-05f;  // 2^-14
    std::memcpy(&u, &f, 4);
  }
  u |= static_cast<uint32_t>(h & 0x8000u) << 16;
  float out;
  std::memcpy(&out, &u, 4);
  return out;
}

inline uint16_t float_to_half(float value) {
  uint32_t u;
  std::memcpy(&u, &value, 4);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint16_t out;
  if (u >= (127u + 16u) << 23) {  // overflow, Inf or NaN
    out = u > (255u << 23) ? 0x7e00 : 0x7c00;
  } else if (u < (113u << 23)) {  // subnormal or zero: let the FPU round at the right bit
    float f;
    std::memcpy(&f, &u, 4);
    f += 0.5f;
    std::memcpy(&u, &f, 4);
    out = static_cast<uint16_t>(u - 0x3f000000u);
  } else {
    const uint32_t odd = (u >> 13) & 1u;
    u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + odd;
    out = static_cast<uint16_t>(u >> 13);
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

inline float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float out;
  std::memcpy(&out, &u, 4);
  return out;
}

inline uint16_t float_to_bf16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace onnx_custom
