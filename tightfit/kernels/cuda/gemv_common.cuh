// tightfit CUDA GEMV: common macros and shims (see CONTRACT.md).
// Compiles under NVRTC / nvcc (__CUDACC__) and as plain host C++ (g++, for the CPU test harness).
#pragma once

#if defined(__CUDACC__)
#define TF_DEVICE 1
#if defined(__CUDACC_RTC__)
// NVRTC has no system headers: fixed-width integer types by hand (LP64 device ABI).
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#else
#include <stdint.h>
#endif
#define TF_DEV __device__ __forceinline__
#define TF_TABLE __device__ const
#else
#define TF_DEVICE 0
#include <math.h>
#include <stdint.h>
#include <string.h>
#define TF_DEV inline
#define TF_TABLE static const
#endif

// Alignment (bytes) the kernel and the host harness guarantee for a block of BB bytes.
#define TF_BLK_ALIGN(BB) (((BB) & -(BB)) > 16 ? 16 : ((BB) & -(BB)))

// ---------------------------------------------------------------- arithmetic
TF_DEV int tf_dp4a(int a, int b, int c) {
#if TF_DEVICE && defined(TF_CSE_FRIENDLY)
  // CUDA's __dp4a is `asm volatile`, which NVVM treats as a memory side effect: no load is reused
  // across it. A plain (non-volatile, no memory clobber) asm lets identical shared loads of the v3
  // kernel's rows be merged.
  int r;
  asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
#elif TF_DEVICE
  return __dp4a(a, b, c);
#else
  for (int k = 0; k < 4; ++k)
    c += (int)(int8_t)(uint8_t)((uint32_t)a >> (8 * k)) * (int)(int8_t)(uint8_t)((uint32_t)b >> (8 * k));
  return c;
#endif
}

// CUDA __byte_perm(a, b, s): result byte k = byte (s >> 4k) & 7 of the 8-byte value {b:a}.
// Keep bit 3 of every selector nibble clear: the device __byte_perm ignores it, the host emulation
// below treats it as PTX's sign-replicate flag (tf_prmt is the primitive that has that mode).
TF_DEV uint32_t tf_byte_perm(uint32_t a, uint32_t b, uint32_t s) {
#if TF_DEVICE
  return __byte_perm(a, b, s);
#else
  uint64_t v = ((uint64_t)b << 32) | a;
  uint32_t r = 0;
  for (int k = 0; k < 4; ++k) {
    uint32_t sel = (s >> (4 * k)) & 15;
    uint32_t byte = (uint32_t)(v >> (8 * (sel & 7))) & 0xFF;
    if (sel & 8) byte = (byte & 0x80) ? 0xFF : 0x00;
    r |= byte << (8 * k);
  }
  return r;
#endif
}

// PTX prmt.b32, default mode: result byte k = byte (s >> 4k) & 7 of {b:a}; when bit 3 of selector
// nibble k is set, the sign bit of that byte replicated instead (0x00 or 0xFF). Only s[15:0] is
// read. Unlike tf_byte_perm (CUDA's __byte_perm ignores bit 3, so the compiler masks the selector
// with an extra LOP3), the raw selector register goes straight into the SASS PRMT.
TF_DEV uint32_t tf_prmt(uint32_t a, uint32_t b, uint32_t s) {
#if TF_DEVICE
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
  return r;
#else
  uint64_t v = ((uint64_t)b << 32) | a;
  uint32_t r = 0;
  for (int k = 0; k < 4; ++k) {
    uint32_t sel = (s >> (4 * k)) & 15;
    uint32_t byte = (uint32_t)(v >> (8 * (sel & 7))) & 0xFF;
    if (sel & 8) byte = (byte & 0x80) ? 0xFF : 0x00;
    r |= byte << (8 * k);
  }
  return r;
#endif
}

// w >> 16 as the high word of w * 2^16: IMAD.HI runs on the FMA pipe, a shift (SHF) on the integer
// ALU pipe, which the nibble-decoding formats saturate (PRMT / LOP3 are ALU-only).
TF_DEV uint32_t tf_hi16(uint32_t w) {
#if TF_DEVICE
  return __umulhi(w, 0x10000u);
#else
  return w >> 16;
#endif
}

// funnel shift right: low 32 bits of ({hi:lo} >> (sh & 31))
TF_DEV uint32_t tf_funnel_r(uint32_t lo, uint32_t hi, uint32_t sh) {
#if TF_DEVICE
  return __funnelshift_r(lo, hi, sh);
#else
  sh &= 31;
  return (uint32_t)(((((uint64_t)hi) << 32) | lo) >> sh);
#endif
}

// 8-byte pair loads for compute1 (callers of compute1 guarantee xd and xs16 8-byte aligned, CONTRACT.md;
// p + 2j with j the pair index)
TF_DEV void tf_ldf2(const float* p, float& a, float& b) {
#if TF_DEVICE
  const float2 v = *(const float2*)p;
  a = v.x; b = v.y;
#else
  a = p[0]; b = p[1];
#endif
}
TF_DEV void tf_ldi2(const int* p, int& a, int& b) {
#if TF_DEVICE
  const int2 v = *(const int2*)p;
  a = v.x; b = v.y;
#else
  a = p[0]; b = p[1];
#endif
}

// NW little-endian words from a 2-byte aligned p as 4-byte aligned words + funnel shifts, like
// tf_ld_words<2, NW>, but the aligned pointer is derived from p by pointer arithmetic (no round trip
// through an integer), so NVVM keeps the global address space: LDG.E.CONSTANT instead of generic LD.
template <int NW>
TF_DEV void tf_ld_words_a2(const uint8_t* p, uint32_t (&w)[NW]) {
#if TF_DEVICE
  const uint32_t mis = (uint32_t)(uint64_t)p & 3u;
  const uint32_t* a = (const uint32_t*)(p - mis);
  const uint32_t sh = mis * 8u;
  uint32_t t[NW + 1];
#pragma unroll
  for (int i = 0; i < NW; ++i) t[i] = __ldg(a + i);
  t[NW] = sh ? __ldg(a + NW) : 0u;
#pragma unroll
  for (int i = 0; i < NW; ++i) w[i] = __funnelshift_r(t[i], t[i + 1], sh);
#else
  memcpy(w, p, 4 * NW);
#endif
}

TF_DEV float tf_h2f(uint16_t h) {
#if TF_DEVICE && defined(TF_CSE_FRIENDLY)
  // plain integer/float arithmetic instead of inline asm: NVVM treats an asm statement as touching
  // memory, which stops it from reusing loads across it (the v3 kernel relies on that reuse).
  // value = mantissa * 2^(exponent - 25) with mantissa = 1024 + m (normal) or m (subnormal,
  // exponent 1): an exact integer times a NORMAL fp32 power of two, so no intermediate is a
  // denormal. (The former form, the fp16 bits moved into an fp32 and multiplied by 2^112, went
  // through an fp32 denormal for every fp16 subnormal and came out 0 under flush-to-zero: the
  // seed-mix 27B's IQ4_XS / Q5_K / Q6_K block scales are fp16 subnormals, ~1e-5, and its N >= 2
  // products on wide matrices read as zero or garbage, session 10.) Exact for zero, subnormal and
  // normal fp16; inf/NaN -> finite.
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  const float mant = (float)(e ? (m | 0x400u) : m);
  const float p2 = __uint_as_float(((e ? e : 1u) + 102u) << 23);   // 2^(max(e, 1) - 25)
  const float v = mant * p2;
  return (h & 0x8000u) ? -v : v;
#elif TF_DEVICE
  float f;  // no <cuda_fp16.h> needed (NVRTC without include paths)
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F;
  uint32_t man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { man <<= 1; ++e; } while (!(man & 0x400));
      man &= 0x3FF;
      bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
#endif
}

// ---------------------------------------------------------------- small integers to fp32 without I2F
// Why: int -> fp32 conversions (I2F / I2FP) issue on the ALU pipe, which the tensor-core GEMV's
// decode (PRMT / LOP3 / SHF) already keeps busy; an FADD goes to the FMA pipe. For |v| < 2^22 the
// fp32 with bits 0x4B400000 + v is 2^23 + 2^22 + v exactly (v moves only the mantissa), so
// subtracting 12582912 gives v exactly: the same value as (float)v, bit for bit.
#define TF_F32_BIAS 0x4B400000        // bits of 12582912.f = 1.5 * 2^23
#define TF_F32_BIASF 12582912.f
TF_DEV float tf_bits_f32(uint32_t b) {
#if TF_DEVICE
  return __uint_as_float(b);
#else
  float f;
  memcpy(&f, &b, 4);
  return f;
#endif
}
// b = TF_F32_BIAS + v as an integer (e.g. an mma accumulated onto C = TF_F32_BIAS), |v| < 2^22
TF_DEV float tf_biased_f32(int b) { return tf_bits_f32((uint32_t)b) - TF_F32_BIASF; }
// u in [0, 2^23): bits 0x4B000000 | u are 2^23 + u exactly; minus (2^23 + off) = u - off exactly
TF_DEV float tf_u23_f32(uint32_t u, int off) {
  return tf_bits_f32(u | 0x4B000000u) - (float)(8388608 + off);
}

// ---------------------------------------------------------------- loads (little-endian)
TF_DEV uint32_t tf_ld_u16(const uint8_t* p) {  // p 2-byte aligned
#if TF_DEVICE
  return *(const uint16_t*)p;
#else
  uint16_t v; memcpy(&v, p, 2); return v;
#endif
}

TF_DEV uint32_t tf_ld_u32(const uint8_t* p) {  // p 4-byte aligned
#if TF_DEVICE
  return *(const uint32_t*)p;
#else
  uint32_t v; memcpy(&v, p, 4); return v;
#endif
}

TF_DEV uint32_t tf_ld_u32_a2(const uint8_t* p) {  // p 2-byte aligned
#if TF_DEVICE
  return (uint32_t)*(const uint16_t*)p | ((uint32_t)*(const uint16_t*)(p + 2) << 16);
#else
  uint32_t v; memcpy(&v, p, 4); return v;
#endif
}

// NW little-endian words from p (p aligned to ALIGN bytes; widest access the alignment allows).
template <int ALIGN, int NW>
TF_DEV void tf_ld_words(const uint8_t* p, uint32_t (&w)[NW]) {
#if TF_DEVICE
  if (ALIGN >= 16 && NW % 4 == 0) {
#pragma unroll
    for (int i = 0; i < NW / 4; ++i) {
      uint4 v = ((const uint4*)p)[i];
      w[4 * i] = v.x; w[4 * i + 1] = v.y; w[4 * i + 2] = v.z; w[4 * i + 3] = v.w;
    }
  } else if (ALIGN >= 8 && NW % 2 == 0) {
#pragma unroll
    for (int i = 0; i < NW / 2; ++i) {
      uint2 v = ((const uint2*)p)[i];
      w[2 * i] = v.x; w[2 * i + 1] = v.y;
    }
  } else if (ALIGN >= 4) {
#pragma unroll
    for (int i = 0; i < NW; ++i) w[i] = ((const uint32_t*)p)[i];
  } else {
    // 2-byte aligned: NW (+1 when p is not 4-aligned) aligned words + funnel shifts; the only
    // bytes touched outside [p, p + 4*NW) are 2 bytes of the aligned word holding the last byte.
    const uint32_t* a = (const uint32_t*)((uint64_t)p & ~(uint64_t)3);
    uint32_t sh = ((uint32_t)(uint64_t)p & 3u) * 8u;
    uint32_t t[NW + 1];
#pragma unroll
    for (int i = 0; i < NW; ++i) t[i] = a[i];
    t[NW] = sh ? a[NW] : 0u;
#pragma unroll
    for (int i = 0; i < NW; ++i) w[i] = __funnelshift_r(t[i], t[i + 1], sh);
  }
#else
  memcpy(w, p, 4 * NW);
#endif
}

// Activation loads (xq is 16-byte aligned at every 32-group).
TF_DEV void tf_ld_x16(const int8_t* p, uint32_t (&w)[4]) {
#if TF_DEVICE
  int4 v = *(const int4*)p;
  w[0] = (uint32_t)v.x; w[1] = (uint32_t)v.y; w[2] = (uint32_t)v.z; w[3] = (uint32_t)v.w;
#else
  memcpy(w, p, 16);
#endif
}

TF_DEV void tf_ld_x8(const int8_t* p, uint32_t (&w)[2]) {
#if TF_DEVICE
  int2 v = *(const int2*)p;
  w[0] = (uint32_t)v.x; w[1] = (uint32_t)v.y;
#else
  memcpy(w, p, 8);
#endif
}

// fp32 / int32 activation side loads
TF_DEV float tf_ldf(const float* p) { return *p; }
TF_DEV int tf_ldi(const int* p) { return *p; }

// ---------------------------------------------------------------- PDL (tightfit/kernels/pdl.py)
// Compiled in only when the launcher defines TF_PDL (gemv_cuda / attn_decode_q_cuda do so exactly
// when they launch with the PDL attribute), so a build without it is the unchanged kernel; no-ops
// on the host build and below sm_90 (griddepcontrol is sm_90 PTX).
#if TF_DEVICE && defined(TF_PDL) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define TF_GDC 1
#else
#define TF_GDC 0
#endif
// L2 prefetch depth before the wait, in loop steps of the row (0: none), set by the launcher:
// TF_PDL_PF for tf_gemv / tf_gemv2* / tf_gemv4 / tf_gemv5*, TF_PDL_PF_V3 (chunks) for tf_gemv3.
#if !TF_GDC || !defined(TF_PDL_PF)
#undef TF_PDL_PF
#define TF_PDL_PF 0
#endif
#if !TF_GDC || !defined(TF_PDL_PF_V3)
#undef TF_PDL_PF_V3
#define TF_PDL_PF_V3 0
#endif

// Wait until the grid this one depends on has completed and its writes are visible. The memory
// clobber keeps every load / store of the kernel below it.
TF_DEV void tf_gdc_wait() {
#if TF_GDC
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Let the next PDL grid be scheduled (a hint; it still waits for this grid's completion).
TF_DEV void tf_gdc_launch_dependents() {
#if TF_GDC
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Pull [p, p + bytes) into L2 with one bulk (TMA) request: p 16-byte aligned, bytes a multiple
// of 16, inside one allocation. Asynchronous, no register result, so one thread per row issues it
// and the kernel's register allocation barely notices (per-line prefetch.L2 from every lane moved
// the v3 kernels by up to 30 registers). Before the wait only for memory no kernel of the step
// writes (weights).
TF_DEV void tf_prefetch_l2_bulk(const void* p, uint32_t bytes) {
#if TF_GDC
  asm volatile("{ .reg .u64 g; cvta.to.global.u64 g, %0; cp.async.bulk.prefetch.L2.global [g], %1; }"
               ::"l"(p), "r"(bytes));
#else
  (void)p; (void)bytes;
#endif
}
