// tightfit skinny GEMM on int8 tensor cores ("mma" path): y[c, r] = sum_k x[c, k] * W[r, k] for
// N = 1..16 activation columns, W in raw GGUF blocks, x = quantize_act layout 0 (CONTRACT.md
// "Semantics"). Include after gemv_common.cuh; nothing else is needed.
//
// Why: the dp4a kernels (gemv_kernel.cuh) decode a weight word once but then pay one dp4a and one
// x load per column, so t(N) grows ~linearly with N. Here one warp owns a 16-row tile (two in
// tf_mma_rt) and every 32-group (16-group for Q6_K) of K is one mma.m16n8k32 (m16n8k16) per row
// tile: the decode is paid once per weight as at N = 1, and the 8 columns of a B tile cost one
// tensor instruction plus an fp32 epilogue per group.
//
// Fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k32" / "m16n8k16", .s8 / .s32), with
// g = lane >> 2, t = lane & 3:
//   A (16 x KS, row-major), KS = 32: a0 = row g, k 4t..4t+3; a1 = row g+8, same k;
//                                    a2 = row g, k 16+4t..; a3 = row g+8, k 16+4t..
//                           KS = 16: a0 = row g, k 4t..4t+3; a1 = row g+8, same k
//   B (KS x 8, column-major): b0 = column g, k 4t..4t+3; (KS = 32) b1 = column g, k 16+4t..
//   C/D (16 x 8): d0, d1 = row g, columns 2t, 2t+1; d2, d3 = row g+8, columns 2t, 2t+1
// (byte i of a register = element k + i).
//
// Permutation freedom: a group's dot product is unchanged by any permutation of its KS positions
// applied to both W and x. Each format therefore hands lane t the weights that are cheapest to
// decode from its packed bytes (afrag, "k slots" 4t.. and 16+4t..) and gathers the x bytes of the
// SAME physical positions into its b words (xfrag). tests/test_gemv_mma.py checks, on the host,
// that the slots of a group cover its KS positions exactly once and that the assembled tiles give
// the reference dequantization's dot.
//
// Format interface (struct M_xxx; all members TF_DEV static):
//   TYPE, QK, BB        GGML type id, weights per block, bytes per block
//   KS, NG              mma k (32 or 16) and groups per block (QK / KS); group j = elements
//                       [KS*j, KS*j + KS) of the block
//   U                   blocks a warp loads back to back per step (bytes in flight per lane)
//   MINS                true when scale() returns a non-zero wm (min / offset term)
//   Raw                 one row's share of one block for lane t (what load() fetches)
//   load(blk, t, Raw&)                  raw loads only (issued for U blocks before any decode)
//   afrag(Raw, t, j, uint32_t (&a)[KS/16])   int8 weights of group j for slots 4t.. (and 16+4t..)
//   xfrag(xb, t, j, uint32_t (&b)[KS/16])   x bytes of the same positions (xb: column's x at the
//                                           block's first element)
//   scale(Raw, j, float& ws, float& wm)  group j of this row: W = ws * code - wm (per element)
// Group value for row r and column c: xd[c, grp] * (ws_r * dot_int - wm_r * sum(x_q over group)).
#pragma once

// TF_MMA_LEGACY=1 (gemv_mma.py: TIGHTFIT_MMA_LEGACY=1) builds the session-11 arithmetic for A/B
// timing: I2F conversions, int64 split arithmetic, a fence.acq_rel at every fixup arrival.
#ifndef TF_MMA_LEGACY
#define TF_MMA_LEGACY 0
#endif
#if TF_MMA_LEGACY
#define TF_MMA_CBIAS 0                // the mma's C: plain integer dots
#else
#define TF_MMA_CBIAS TF_F32_BIAS      // the mma's C: dots come out as fp32 bits (tf_biased_f32)
#endif

// TF_MMA_MINS_TC=0 (gemv_mma.py: TIGHTFIT_MMA_MINS_TC=0) builds session 19's K-quant epilogue, the
// min term per group and element, for A/B timing; 1 (the default) takes it to the tensor core
// once per block (tf_mma_block). Needs the biased mma output, so not with TF_MMA_LEGACY.
#ifndef TF_MMA_MINS_TC
#define TF_MMA_MINS_TC (!TF_MMA_LEGACY)
#endif

#define TF_MMA_THREADS 256
#define TF_MMA_WARPS (TF_MMA_THREADS / 32)
// Resident CTAs per SM the kernels are built for (launch bounds: 2 -> 128 registers, 3 -> 80).
// gemv_mma.py: TIGHTFIT_MMA_MINB, an occupancy A/B (offline at 3: every default kernel spills
// 80-900 bytes; session 13's reading is that the kernels wait on latency with 4 warps per scheduler).
#ifndef TF_MMA_MINB
#define TF_MMA_MINB 2
#endif
#define TF_MMA_M4 0x0F0F0F0Fu

// 8 bytes at a 8-byte aligned p
TF_DEV void tf_mma_ld8(const uint8_t* p, uint32_t& a, uint32_t& b) {
#if TF_DEVICE
  const uint2 v = *(const uint2*)p;
  a = v.x; b = v.y;
#else
  memcpy(&a, p, 4); memcpy(&b, p + 4, 4);
#endif
}
TF_DEV void tf_mma_ldx8(const int8_t* p, uint32_t& a, uint32_t& b) {
  tf_mma_ld8((const uint8_t*)p, a, b);
}
TF_DEV uint32_t tf_mma_ldx4(const int8_t* p) { return tf_ld_u32((const uint8_t*)p); }

// ------------------------------------------------------------------ Q8_0 (type 8)
// d f16 @0, 32 x int8 @2 (block 2-byte aligned). Lane t: bytes 8t..8t+7 (positions 8t..8t+7),
// x as one 8-byte load at element 8t. U = 8 blocks (272 bytes per row) per step.
struct M_Q8_0 {
  static constexpr int TYPE = 8, QK = 32, BB = 34, KS = 32, NG = 1, U = 8;
  static constexpr bool MINS = false;
  struct Raw { uint32_t d, q[2]; };
  TF_DEV static void load(const uint8_t* __restrict__ blk, int t, Raw& r) {
    r.d = tf_ld_u16(blk);
    tf_ld_words_a2<2>(blk + 2 + 8 * t, r.q);
  }
  TF_DEV static void afrag(const Raw& r, int t, int j, uint32_t (&a)[2]) {
    (void)t; (void)j;
    a[0] = r.q[0]; a[1] = r.q[1];
  }
  TF_DEV static void xfrag(const int8_t* __restrict__ xb, int t, int j, uint32_t (&b)[2]) {
    (void)j;
    tf_mma_ldx8(xb + 8 * t, b[0], b[1]);
  }
  TF_DEV static void scale(const Raw& r, int j, float& ws, float& wm) {
    (void)j;
    ws = tf_h2f((uint16_t)r.d); wm = 0.f;
  }
};

// ------------------------------------------------------------------ K4 scales (Q4_K / Q5_K)
// S = scales bytes 0..11 as words S0 S1 S2 (h[1..3]); sub-block j: j < 4: sc = S[j] & 63,
// m = S[j+4] & 63; j >= 4: sc = (S[j+4] & 15) | (S[j-4] >> 6) << 4, m = (S[j+4] >> 4) | (S[j] >> 6) << 4.
// j is a compile-time constant after unrolling, so every shift below is an immediate.
// The four 6-bit scales sc of groups j & ~3 .. (j & ~3) + 3 as bytes (byte k = group (j & ~3) + k).
TF_DEV uint32_t tf_mma_k4_sc4(const uint32_t (&h)[4], int j) {
  const uint32_t S0 = h[1], S2 = h[3];
  return j < 4 ? (S0 & 0x3F3F3F3Fu) : ((S2 & 0x0F0F0F0Fu) | ((S0 >> 2) & 0x30303030u));
}
TF_DEV void tf_mma_k4_scale(const uint32_t (&h)[4], int j, float& ws, float& wm) {
  const uint32_t S1 = h[2], S2 = h[3];
#if TF_MMA_LEGACY
  const uint32_t S0 = h[1];
  uint32_t sc, m;
  if (j < 4) {
    sc = (S0 >> (8 * j)) & 63u;
    m = (S1 >> (8 * j)) & 63u;
  } else {
    const int k = j - 4;
    sc = ((S2 >> (8 * k)) & 15u) | (((S0 >> (8 * k + 6)) & 3u) << 4);
    m = ((S2 >> (8 * k + 4)) & 15u) | (((S1 >> (8 * k + 6)) & 3u) << 4);
  }
  ws = tf_h2f((uint16_t)h[0]) * (float)sc;
  wm = tf_h2f((uint16_t)(h[0] >> 16)) * (float)m;
#else
  // The four 6-bit values of a word at once (byte k = value k: the same masks serve four j, and
  // ptxas shares them across the unrolled groups), then one PRMT per value builds the fp32 bits
  // 0x4B0000vv = 2^23 + v (bytes 1, 2 from the constant's zero bytes, byte 3 its 0x4B).
  const uint32_t sc4 = tf_mma_k4_sc4(h, j);
  const uint32_t m4 = j < 4 ? (S1 & 0x3F3F3F3Fu)
                            : (((S2 >> 4) & 0x0F0F0F0Fu) | ((S1 >> 2) & 0x30303030u));
  const uint32_t sel = 0x7440u | (uint32_t)(j & 3);
  ws = tf_h2f((uint16_t)h[0]) * (tf_bits_f32(tf_prmt(sc4, 0x4B000000u, sel)) - 8388608.f);
  wm = tf_h2f((uint16_t)(h[0] >> 16)) * (tf_bits_f32(tf_prmt(m4, 0x4B000000u, sel)) - 8388608.f);
#endif
}

// ------------------------------------------------------------------ K4 scales, lean epilogue
// Why (session 20): per group and element the epilogue above costs 4 FP operations (unbias, times
// ws, minus wm * xs, times xd) plus 6 per row for ws and wm: ~28 of the ~60 instructions per mma
// of Q5_K's tf_mma_rt. Two identities cut that to ~14:
//  * ws = d * sc and nws = -TF_F32_BIASF * ws are exact in fp32 (d is an fp16 value, 11 significant
//    bits; sc has 6 and 1.5 * 2^23 two more), so ws * (TF_F32_BIASF + dot) + nws, one FFMA on the
//    biased mma output, is ws * dot rounded once: the value FMUL(ws, dot) gave;
//  * the min term sum_g dmin * m_g * X_g (X_g = xd * xs of the column's 32-group g) does not depend
//    on the weights' codes: per block and 16-row tile it is one m16n8k8 tf32 product (rows x the
//    block's 8 groups x 8 columns), A = the integers m_g (exact in tf32), B = X as two tf32 terms
//    (hi = X rounded, lo = X - hi: X to ~2^-21), dmin applied per block and element.
// tf32 fragments (PTX ISA, "mma.m16n8k8" .tf32): a0 = (row g, k t), a1 = (g + 8, t), a2 = (g, t + 4),
// a3 = (g + 8, t + 4); b0 = (k t, column g), b1 = (t + 4, g); C / D as the int8 products.
// ws and nws of group j: one PRMT (2^23 + sc as fp32 bits) and two FFMA with the row's
// dn = -2^23 * d, bd = -TF_F32_BIASF * d and bdn = TF_F32_BIASF * 2^23 * d (all exact).
TF_DEV void tf_mma_k4_ws(const uint32_t (&h)[4], int j, float d, float dn, float bd, float bdn,
                         float& ws, float& nws) {
  const float f = tf_bits_f32(tf_prmt(tf_mma_k4_sc4(h, j), 0x4B000000u, 0x7440u | (uint32_t)(j & 3)));
  ws = fmaf(d, f, dn);
  nws = fmaf(bd, f, bdn);
}
// The mins of groups t and t + 4 (lane t's k slots of the tf32 product) as exact fp32 integers.
TF_DEV void tf_mma_k4_mins_t(const uint32_t (&h)[4], int t, float& m0, float& m4) {
  const uint32_t S1 = h[2], S2 = h[3];
  const int sh = 8 * t;
  m0 = tf_u23_f32((S1 >> sh) & 63u, 0);
  m4 = tf_u23_f32(((S2 >> (sh + 4)) & 15u) | ((S1 >> (sh + 2)) & 0x30u), 0);
}

// The per-row constants of tf_mma_k4_ws for a block with header words h: d, dmin and the products.
struct tf_mma_k4_row { float d, dn, bd, bdn, dmin; };
TF_DEV tf_mma_k4_row tf_mma_k4_consts(const uint32_t (&h)[4]) {
  tf_mma_k4_row k;
  k.d = tf_h2f((uint16_t)h[0]);
  k.dmin = tf_h2f((uint16_t)(h[0] >> 16));
  k.dn = -8388608.f * k.d;
  k.bd = -TF_F32_BIASF * k.d;
  k.bdn = (TF_F32_BIASF * 8388608.f) * k.d;
  return k;
}

// ------------------------------------------------------------------ Q4_K (type 12)
// d f16 @0, dmin f16 @2, scales[12] @4, qs[128] @16: chunk c (bytes 16+32c..) holds sub-block 2c
// in its low nibbles, 2c+1 in its high nibbles (element 32*(2c+h) + l in byte l). Lane t keeps
// bytes 8t..8t+7 of every chunk (one 8-byte load each): the low nibbles of those 8 bytes are
// positions 8t..8t+7 of sub-block 2c, the high nibbles the same positions of 2c+1, so x is one
// 8-byte load at element 32j + 8t for either.
struct M_Q4_K {
  static constexpr int TYPE = 12, QK = 256, BB = 144, KS = 32, NG = 8, U = 2;
  static constexpr bool MINS = true;
  struct Raw { uint32_t h[4], q[8]; };
  TF_DEV static void load(const uint8_t* __restrict__ blk, int t, Raw& r) {
    tf_ld_words<16, 4>(blk, r.h);
#pragma unroll
    for (int c = 0; c < 4; ++c) tf_mma_ld8(blk + 16 + 32 * c + 8 * t, r.q[2 * c], r.q[2 * c + 1]);
  }
  TF_DEV static void afrag(const Raw& r, int t, int j, uint32_t (&a)[2]) {
    (void)t;
    const int c = j >> 1, sh = 4 * (j & 1);
    a[0] = (r.q[2 * c] >> sh) & TF_MMA_M4;
    a[1] = (r.q[2 * c + 1] >> sh) & TF_MMA_M4;
  }
  TF_DEV static void xfrag(const int8_t* __restrict__ xb, int t, int j, uint32_t (&b)[2]) {
    tf_mma_ldx8(xb + 32 * j + 8 * t, b[0], b[1]);
  }
  TF_DEV static void scale(const Raw& r, int j, float& ws, float& wm) {
    tf_mma_k4_scale(r.h, j, ws, wm);
  }
};

// ------------------------------------------------------------------ Q5_K (type 13)
// d @0, dmin @2, scales[12] @4, qh[32] @16 (bit j of qh[l] = fifth bit of element 32j + l),
// qs[128] @48 (as Q4_K). Lane t: qs bytes 8t..8t+7 of every chunk (as Q4_K) and qh bytes
// 8t..8t+7, whose bit j is the fifth bit of the same positions of sub-block j.
struct M_Q5_K {
  static constexpr int TYPE = 13, QK = 256, BB = 176, KS = 32, NG = 8, U = 2;
  static constexpr bool MINS = true;
  struct Raw { uint32_t h[4], qh[2], q[8]; };
  TF_DEV static void load(const uint8_t* __restrict__ blk, int t, Raw& r) {
    tf_ld_words<16, 4>(blk, r.h);
    tf_mma_ld8(blk + 16 + 8 * t, r.qh[0], r.qh[1]);
#pragma unroll
    for (int c = 0; c < 4; ++c) tf_mma_ld8(blk + 48 + 32 * c + 8 * t, r.q[2 * c], r.q[2 * c + 1]);
  }
  TF_DEV static void afrag(const Raw& r, int t, int j, uint32_t (&a)[2]) {
    (void)t;
    const int c = j >> 1, sh = 4 * (j & 1);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      // bit j of each qh byte -> bit 4 (j >= 4: shift right, else left; both immediates)
      const uint32_t hb = j >= 4 ? (r.qh[i] >> (j - 4)) : (r.qh[i] << (4 - j));
      a[i] = ((r.q[2 * c + i] >> sh) & TF_MMA_M4) | (hb & 0x10101010u);
    }
  }
  TF_DEV static void xfrag(const int8_t* __restrict__ xb, int t, int j, uint32_t (&b)[2]) {
    tf_mma_ldx8(xb + 32 * j + 8 * t, b[0], b[1]);
  }
  TF_DEV static void scale(const Raw& r, int j, float& ws, float& wm) {
    tf_mma_k4_scale(r.h, j, ws, wm);
  }
};

// ------------------------------------------------------------------ Q6_K (type 14)
// ql[128] @0, qh[64] @128, int8 scales[16] @192, d f16 @208 (block 2-byte aligned only).
// Element 128n + 32k + l: low 4 bits = ql[64n + 32(k&1) + l] nibble k>>1, high 2 bits =
// qh[32n + l] bits 2k..2k+1, scale = scales[8n + 2k + l/16]; w = d*sc*(q - 32). One scale per 16
// elements, so KS = 16 (m16n8k16): group G = 8n + 2k + lh = elements 16G.. (l = 16lh + 0..15).
// Lane t: positions 4t..4t+3 of each group: ql bytes 16m + 4t (m = 4n + 2(k&1) + lh, 8 words,
// each serving k and k+2) and qh bytes 128 + 16(2n + lh) + 4t (4 words, each serving k = 0..3).
// The -32 offset goes through the group's x sum: wm = 32 * ws.
struct M_Q6_K {
  // U = 1: at U = 2 the 16 groups' hoisted x words and sums spilled at 128 registers
  static constexpr int TYPE = 14, QK = 256, BB = 210, KS = 16, NG = 16, U = 1;
  static constexpr bool MINS = true;
  static constexpr int OFF = 32;       // wm = OFF * ws: the offset folds into the integer dot
  struct Raw { uint32_t ql[8], qh[4], sc[4], d; };
  TF_DEV static void load(const uint8_t* __restrict__ blk, int t, Raw& r) {
#pragma unroll
    for (int m = 0; m < 8; ++m) r.ql[m] = tf_ld_u32_a2(blk + 16 * m + 4 * t);
#pragma unroll
    for (int m = 0; m < 4; ++m) r.qh[m] = tf_ld_u32_a2(blk + 128 + 16 * m + 4 * t);
#pragma unroll
    for (int m = 0; m < 4; ++m) r.sc[m] = tf_ld_u32_a2(blk + 192 + 4 * m);
    r.d = tf_ld_u16(blk + 208);
  }
  TF_DEV static void afrag(const Raw& r, int t, int G, uint32_t (&a)[1]) {
    (void)t;
    const int n = G >> 3, k = (G >> 1) & 3, lh = G & 1;
    const uint32_t lo = (r.ql[4 * n + 2 * (k & 1) + lh] >> (4 * (k >> 1))) & TF_MMA_M4;
    const uint32_t hq = r.qh[2 * n + lh];
    const uint32_t hi = (2 * k <= 4 ? (hq << (4 - 2 * k)) : (hq >> (2 * k - 4))) & 0x30303030u;
    a[0] = lo | hi;
  }
  TF_DEV static void xfrag(const int8_t* __restrict__ xb, int t, int G, uint32_t (&b)[1]) {
    b[0] = tf_mma_ldx4(xb + 16 * G + 4 * t);
  }
  TF_DEV static void scale(const Raw& r, int G, float& ws, float& wm) {
    const int sc = (int)(int8_t)(uint8_t)(r.sc[G >> 2] >> (8 * (G & 3)));
#if TF_MMA_LEGACY
    ws = tf_h2f((uint16_t)r.d) * (float)sc;
#else
    ws = tf_h2f((uint16_t)r.d) * tf_biased_f32(TF_F32_BIAS + sc);
#endif
    wm = 32.f * ws;
  }
};

// ------------------------------------------------------------------ IQ4_XS (type 23)
// d f16 @0, scales_h u16 @2, scales_l[4] @4, qs[128] @8: sub-block j = qs bytes 16j..16j+15, byte i
// low nibble = element i, high nibble = element i + 16; ls = ((scales_l >> 4j) & 15) |
// ((scales_h >> 2j) & 3) << 4, w = d * (ls - 32) * kvalues[code].
// Lane t: qs bytes 16j + 4t..4t+3 (one aligned word). A PRMT lookup reads the word's nibbles in
// place, so its 4 results are the elements (4t, 4t+16, 4t+1, 4t+17) (low half of the word) and
// (4t+2, 4t+18, 4t+3, 4t+19) (high half): those are this lane's slot orders, and x is permuted to
// match (2 PRMT per column and group) instead of re-interleaving the lookups per row.
#define TF_MMA_IQ4_T0 0xBFAD9881u   // kvalues_iq4nl[0..3], little-endian bytes
#define TF_MMA_IQ4_T1 0xF6EADDCFu   // [4..7]
#define TF_MMA_IQ4_T2 0x26190D01u   // [8..11]
#define TF_MMA_IQ4_T3 0x71594535u   // [12..15]
// The 8 codes = nibbles of w -> their int8 kvalues: lo = nibbles 0..3, hi = nibbles 4..7 (byte k
// = nibble k). Per half: nibble k of the PRMT selector picks entry k (low table pair) or k + 4
// (high pair) when bit 3 of code k is set. The masks are formed once for the whole word and moved
// down for the high half by tf_hi16 (FMA pipe): 2 ALU operations fewer per word than decoding the
// halves apart, on the ALU pipe the decode keeps busy.
TF_DEV void tf_mma_iq4_lut2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t s7 = w & 0x77777777u;
  const uint32_t m = ((w >> 1) & 0x44444444u) | 0x32103210u;
  lo = tf_prmt(tf_prmt(TF_MMA_IQ4_T0, TF_MMA_IQ4_T1, s7), tf_prmt(TF_MMA_IQ4_T2, TF_MMA_IQ4_T3, s7), m);
  const uint32_t s7h = tf_hi16(s7), mh = tf_hi16(m);
  hi = tf_prmt(tf_prmt(TF_MMA_IQ4_T0, TF_MMA_IQ4_T1, s7h), tf_prmt(TF_MMA_IQ4_T2, TF_MMA_IQ4_T3, s7h), mh);
}
struct M_IQ4_XS {
  static constexpr int TYPE = 23, QK = 256, BB = 136, KS = 32, NG = 8, U = 2;
  static constexpr bool MINS = false;
  struct Raw { uint32_t h[2], q[8]; };
  TF_DEV static void load(const uint8_t* __restrict__ blk, int t, Raw& r) {
    tf_mma_ld8(blk, r.h[0], r.h[1]);
#pragma unroll
    for (int j = 0; j < 8; ++j) r.q[j] = tf_ld_u32(blk + 8 + 16 * j + 4 * t);
  }
  TF_DEV static void afrag(const Raw& r, int t, int j, uint32_t (&a)[2]) {
    (void)t;
    tf_mma_iq4_lut2(r.q[j], a[0], a[1]);
  }
  TF_DEV static void xfrag(const int8_t* __restrict__ xb, int t, int j, uint32_t (&b)[2]) {
    const uint32_t x0 = tf_mma_ldx4(xb + 32 * j + 4 * t), x1 = tf_mma_ldx4(xb + 32 * j + 16 + 4 * t);
    b[0] = tf_prmt(x0, x1, 0x5140u);   // elements 4t, 4t+16, 4t+1, 4t+17
    b[1] = tf_prmt(x0, x1, 0x7362u);   // 4t+2, 4t+18, 4t+3, 4t+19
  }
  TF_DEV static void scale(const Raw& r, int j, float& ws, float& wm) {
    const uint32_t ls = ((r.h[1] >> (4 * j)) & 15u) | (((r.h[0] >> (16 + 2 * j)) & 3u) << 4);
#if TF_MMA_LEGACY
    ws = tf_h2f((uint16_t)r.h[0]) * (float)((int)ls - 32);
#else
    ws = tf_h2f((uint16_t)r.h[0]) * tf_u23_f32(ls, 32);
#endif
    wm = 0.f;
  }
};

// Integer code offset of a format whose wm is OFF * ws (Q6_K: 32), else 0.
template <class M, class = void> struct tf_mma_off { static constexpr int v = 0; };
template <class M> struct tf_mma_off<M, decltype((void)M::OFF)> { static constexpr int v = M::OFF; };

// Formats whose 32-element groups carry one scale per 16-element half (SPLIT; gemv_mma_iq.cuh):
// scale() returns (ws of half 0, ws of half 1), and lanes 0-1 hold half 0's elements.
template <class M, class = void> struct tf_mma_split { static constexpr bool v = false; };
template <class M> struct tf_mma_split<M, decltype((void)M::SPLIT)> { static constexpr bool v = M::SPLIT; };

// The grid formats' structs are in gemv_mma_iq.cuh (included after this file).
#define TF_MMA_FORMATS(X) X(M_Q8_0, 8) X(M_Q4_K, 12) X(M_Q5_K, 13) X(M_Q6_K, 14) X(M_IQ4_XS, 23) \
  X(M_IQ2_XS, 17) X(M_IQ3_XXS, 18) X(M_IQ3_S, 21) X(M_IQ2_S, 22)

// Blocks per step: the format's U at NT = RT = 1; at NT = 2 the second tile's hoisted x words,
// scales and sums take the registers of U - 1 blocks' raw words (ptxas spilled at U = 2, 128
// registers), and RT = 2 row tiles hold twice the raw words per block, so the 256-element formats
// step one block at a time there (Q8_0: U / RT). gemv_mma.py mirrors this (step_blocks()).
template <class M, int NT, int RT = 1> struct tf_mma_u {
  static constexpr int U = M::QK == 32 ? M::U / RT : ((NT == 1 && RT == 1) ? M::U : 1);
};


// ------------------------------------------------------------------ stream-K bookkeeping
// Host and device (the g++ harness runs these; gemv_mma.fixup_plan mirrors them in Python).
// Items = (tile group, step); warp w of nw takes items [tf_mma_start(w), tf_mma_start(w + 1)).
#define TF_MMA_SLOT_FLOATS 8      // fixup slot floats per lane: max NT * RT * 4 over the kernels
// Split arithmetic in 32 bits: gemv_mma.geometry() refuses a launch with items * nw >= 2^32, so
// every product below fits, and a 32-bit division is a short inline sequence where the int64 one
// was a called routine (several per fixup arrival). TF_MMA_LEGACY keeps int64.
#if TF_MMA_LEGACY
typedef int64_t tf_mma_ix;
#else
typedef uint32_t tf_mma_ix;
#endif
TF_DEV tf_mma_ix tf_mma_start(tf_mma_ix items, tf_mma_ix nw, tf_mma_ix w) { return items * w / nw; }
// Owner of item i: the largest w with start(w) <= i, i.e. items * w < (i + 1) * nw (never empty).
TF_DEV tf_mma_ix tf_mma_owner(tf_mma_ix items, tf_mma_ix nw, tf_mma_ix i) {
  return ((i + 1) * nw - 1) / items;
}
// Fixup slot of warp w's piece of tile group tg (a = tg * spt, its first item): 0 when w's range
// starts inside tg, i.e. start(w) >= a (tg is w's first group), else 1 (tg is then w's last group:
// the groups between are covered whole and use no slot).
TF_DEV int tf_mma_slot(tf_mma_ix items, tf_mma_ix nw, tf_mma_ix a, tf_mma_ix w) {
  return tf_mma_start(items, nw, w) >= a ? 0 : 1;
}
// Pieces of tile group tg: P, and piece k's warp (ascending in k). wf = owner of its first item.
// items >= nw: no warp is empty (each gets >= 1 item), so the pieces are warps wf .. wf + P - 1,
// wf + P - 1 = owner of its last item. items < nw: every non-empty warp has exactly one item, so
// there is one piece per item: P = spt, piece k = owner(a + k).
TF_DEV int tf_mma_pieces(tf_mma_ix items, tf_mma_ix nw, int spt, tf_mma_ix a) {
  return items >= nw ? (int)(tf_mma_owner(items, nw, a + spt - 1) - tf_mma_owner(items, nw, a) + 1)
                     : spt;
}
TF_DEV tf_mma_ix tf_mma_piece(tf_mma_ix items, tf_mma_ix nw, tf_mma_ix a, tf_mma_ix wf, int k) {
  return items >= nw ? wf + k : tf_mma_owner(items, nw, a + k);
}
// Only piece 0 can use slot 1: every later piece's warp starts after a (start(wf + 1) > a).

#if TF_DEVICE
// This warp's item range [it, iend) in a launch over `items` items (tf_mma_start of its global warp
// id and of the next): the first lines of every stream-K kernel here and in gemv_mmh.cuh.
TF_DEV void tf_mma_warp_range(tf_mma_ix items, int& it, int& iend) {
  const tf_mma_ix nw = (tf_mma_ix)gridDim.x * TF_MMA_WARPS;
  const tf_mma_ix gw = (tf_mma_ix)blockIdx.x * TF_MMA_WARPS + (threadIdx.x >> 5);
  it = (int)(items * gw / nw);
  iend = (int)(items * (gw + 1) / nw);
}
#endif

#if TF_DEVICE
// ------------------------------------------------------------------ tensor-core primitives
// One mma per group (the group's scales differ, so its integer dot must come out separately):
// D = A . B + C with C = TF_MMA_CBIAS (per column: c[0], c[1] = columns 2t, 2t+1 of rows g and
// g+8), so D's bits are the fp32 TF_F32_BIASF + dot (tf_biased_f32) and no I2F is needed.
// Plain asm (no volatile / memory clobber): pure register arithmetic.
TF_DEV void tf_mma_k32(const uint32_t (&a)[4], const uint32_t (&b)[2], const int (&c)[2],
                       int (&d)[4]) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%10,%11};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(c[0]), "r"(c[1]));
}
TF_DEV void tf_mma_k16(const uint32_t (&a)[2], const uint32_t (&b)[1], const int (&c)[2],
                       int (&d)[4]) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%7,%8,%7,%8};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(b[0]), "r"(c[0]), "r"(c[1]));
}

// D += A . B on tf32 (the K-quants' min term, see tf_mma_k4_ws).
TF_DEV void tf_mma_tf32(const uint32_t (&a)[4], const uint32_t (&b)[2], float (&d)[4]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// x = hi + lo with hi the tf32 nearest x (low 13 bits zero) and lo = x - hi exactly; the mma reads
// lo's top 19 bits, so hi + lo carries x to ~2^-21 relative.
TF_DEV void tf_mma_tf32_split(float x, uint32_t& hi, uint32_t& lo) {
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(hi) : "f"(x));
  lo = __float_as_uint(x - __uint_as_float(hi));
}

// Activation side loads of the epilogue (device: one vector load each; alignment below).
template <int NV>
TF_DEV void tf_mma_ldf(const float* p, float (&v)[NV]) {    // p aligned to 4 * NV bytes
  if constexpr (NV == 2) {
    const float2 a = *(const float2*)p;
    v[0] = a.x; v[1] = a.y;
  } else {
    v[0] = *p;
  }
}
template <int NV>
TF_DEV void tf_mma_ldi(const int* p, int (&v)[NV]) {        // p aligned to 4 * NV bytes
  if constexpr (NV == 4) {
    const int4 a = *(const int4*)p;
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
  } else {
    const int2 a = *(const int2*)p;
    v[0] = a.x; v[1] = a.y;
  }
}

// One mma of group j and its fp32 epilogue: d = (rows g, g+8) x (columns 2t, 2t+1) of the tile.
// xdv[cc] = x scale of column cc's 32-group, xs[cc] = its integer sum over the group (MINS only).
// SPLIT formats (IQ2_XS, IQ2_S: a scale per 16-element half): ws = half 0's scale, wm = half 1's.
// Lanes 0-1 hold a group's first half, 2-3 its second: one mma per half on the whole A fragment
// with the other half's B slots zeroed (4 selects), each half's dot scaled by its own ws.
template <class M>
TF_DEV void tf_mma_group(const uint32_t (&w0)[M::KS / 16], const uint32_t (&w1)[M::KS / 16],
                         const uint32_t (&b)[M::KS / 16], float ws0, float wm0, float ws1,
                         float wm1, const float (&xdv)[2], const int (&xs)[2], float (&acc)[4]) {
  if constexpr (tf_mma_split<M>::v) {
    static_assert(M::KS == 32 && !M::MINS, "SPLIT: 32-element groups without mins");
    const bool half0 = (threadIdx.x & 3) < 2;
    const uint32_t bl[2] = {half0 ? b[0] : 0u, half0 ? b[1] : 0u};
    const uint32_t bh[2] = {half0 ? 0u : b[0], half0 ? 0u : b[1]};
    const int c[2] = {TF_F32_BIAS, TF_F32_BIAS};
    const uint32_t a[4] = {w0[0], w1[0], w0[1], w1[1]};
    int dl[4], dh[4];
    tf_mma_k32(a, bl, c, dl);
    tf_mma_k32(a, bh, c, dh);
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
      const float s0 = fmaf(ws0, tf_biased_f32(dl[cc]), wm0 * tf_biased_f32(dh[cc]));
      const float s1 = fmaf(ws1, tf_biased_f32(dl[2 + cc]), wm1 * tf_biased_f32(dh[2 + cc]));
      acc[cc] = fmaf(xdv[cc], s0, acc[cc]);
      acc[2 + cc] = fmaf(xdv[cc], s1, acc[2 + cc]);
    }
    (void)xs;
    return;
  }
  int d[4];
#if TF_MMA_LEGACY
  const int c[2] = {0, 0};
  constexpr bool FOLD = false;
#else
  // Q6_K (OFF = 32): W = ws * (code - 32), so the group's value is ws * (dot - 32 * xsum): the
  // offset rides in the mma's C (|dot - 32 xsum| < 2^22) and the float mins term goes away.
  constexpr bool FOLD = tf_mma_off<M>::v != 0;
  int c[2] = {TF_MMA_CBIAS, TF_MMA_CBIAS};
  if constexpr (FOLD) {
    c[0] -= tf_mma_off<M>::v * xs[0];
    c[1] -= tf_mma_off<M>::v * xs[1];
  }
#endif
  if constexpr (M::KS == 32) {
    const uint32_t a[4] = {w0[0], w1[0], w0[1], w1[1]};
    tf_mma_k32(a, b, c, d);
  } else {
    const uint32_t a[2] = {w0[0], w1[0]};
    tf_mma_k16(a, b, c, d);
  }
#pragma unroll
  for (int cc = 0; cc < 2; ++cc) {
#if TF_MMA_LEGACY
    float s0 = ws0 * (float)d[cc], s1 = ws1 * (float)d[2 + cc];
#else
    float s0 = ws0 * tf_biased_f32(d[cc]), s1 = ws1 * tf_biased_f32(d[2 + cc]);
#endif
    if constexpr (M::MINS && !FOLD) {
      const float f = (float)xs[cc];
      s0 -= wm0 * f;
      s1 -= wm1 * f;
    }
    acc[cc] += xdv[cc] * s0;
    acc[2 + cc] += xdv[cc] * s1;
  }
}

// tf_mma_group without the min term (TF_MMA_MINS_TC; tf_mma_k4_ws): acc += xd * (ws * dot), the
// product from the biased mma output in one FFMA (nws = -TF_F32_BIASF * ws).
TF_DEV void tf_mma_group_lean(const uint32_t (&w0)[2], const uint32_t (&w1)[2],
                              const uint32_t (&b)[2], float ws0, float nws0, float ws1, float nws1,
                              const float (&xdv)[2], float (&acc)[4]) {
  int d[4];
  const int c[2] = {TF_F32_BIAS, TF_F32_BIAS};
  const uint32_t a[4] = {w0[0], w1[0], w0[1], w1[1]};
  tf_mma_k32(a, b, c, d);
#pragma unroll
  for (int cc = 0; cc < 2; ++cc) {
    acc[cc] = fmaf(xdv[cc], fmaf(ws0, __int_as_float(d[cc]), nws0), acc[cc]);
    acc[2 + cc] = fmaf(xdv[cc], fmaf(ws1, __int_as_float(d[2 + cc]), nws1), acc[2 + cc]);
  }
}

// x scales of the 64-element chunk ch of block bb (256-element blocks) for the lane's two
// epilogue columns of tile T: xd2[cc][q] = column (8T + 2t + cc)'s scale of the chunk's group q
template <int NT>
TF_DEV void tf_mma_xd64(const float* __restrict__ xd, const int (&co)[NT][2], int T, int bb, int ch,
                        float (&xd2)[2][2]) {
#pragma unroll
  for (int cc = 0; cc < 2; ++cc) tf_mma_ldf<2>(xd + (co[T][cc] + bb * 8 + 2 * ch), xd2[cc]);
}

// One block of RT row tiles (r0[rt] = row 16rt + g, r1[rt] = row 16rt + g + 8 of the warp's tile
// group) against NT B tiles. bb = block index in the row; xo[T] = element offset of the tile's B
// column (8T + g, clamped) in xq; co[T][cc] = offset of the epilogue column 8T + 2t + cc (clamped)
// in xd (its offset in xs16 is twice that). 32-bit offsets: NT * 3 registers fewer than pointers.
// Per tile the block's pointers are formed once (the group loads then take immediate offsets) and
// the epilogue's scales / sums come per 64-element chunk as one float2 (xd of its two 32-groups)
// and one int4 (its four 16-sums) per column: 2 loads per chunk and column instead of 6 scalar
// ones (alignment: K is a multiple of 256, so every column starts 32-byte aligned in xd and xs16;
// a chunk at element 64c sits at xd + 2c, xs16 + 4c; 32-element chunks: xd + c, xs16 + 2c).
// The weight fragments of a chunk's groups are decoded once and shared by the NT tiles; the x
// fragments and column scales of a tile are loaded once and shared by the RT row tiles (at N = 8
// the x side of a 16-row tile is ~1.2x its weight bytes through L1, so RT = 2 halves that).
template <class M, int NT, int RT>
TF_DEV void tf_mma_block(const typename M::Raw (&r0)[RT], const typename M::Raw (&r1)[RT], int t,
                         int bb, const int8_t* __restrict__ xq, const float* __restrict__ xd,
                         const int* __restrict__ xs16, const int (&xo)[NT], const int (&co)[NT][2],
                         float (&acc)[RT][NT][4]) {
  constexpr int KW = M::KS / 16;
  if constexpr (M::QK == 32) {              // Q8_0: one group per block, no sums
    uint32_t w0[RT][KW], w1[RT][KW];
    float ws0[RT], wm0[RT], ws1[RT], wm1[RT];
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      M::afrag(r0[rt], t, 0, w0[rt]);
      M::afrag(r1[rt], t, 0, w1[rt]);
      M::scale(r0[rt], 0, ws0[rt], wm0[rt]);
      M::scale(r1[rt], 0, ws1[rt], wm1[rt]);
    }
#pragma unroll
    for (int T = 0; T < NT; ++T) {
      uint32_t b[KW];
      M::xfrag(xq + (xo[T] + bb * M::QK), t, 0, b);
      const float xdv[2] = {tf_ldf(xd + (co[T][0] + bb)), tf_ldf(xd + (co[T][1] + bb))};
      const int xs[2] = {0, 0};
#pragma unroll
      for (int rt = 0; rt < RT; ++rt)
        tf_mma_group<M>(w0[rt], w1[rt], b, ws0[rt], wm0[rt], ws1[rt], wm1[rt], xdv, xs, acc[rt][T]);
    }
  } else if constexpr (M::MINS && tf_mma_off<M>::v == 0 && TF_MMA_MINS_TC) {   // Q4_K, Q5_K
    tf_mma_k4_row k0[RT], k1[RT];
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      k0[rt] = tf_mma_k4_consts(r0[rt].h);
      k1[rt] = tf_mma_k4_consts(r1[rt].h);
    }
#pragma unroll
    for (int ch = 0; ch < 4; ++ch) {                         // 64-element chunks: groups 2ch, 2ch+1
      uint32_t w0[RT][2][2], w1[RT][2][2];
      float ws0[RT][2], nws0[RT][2], ws1[RT][2], nws1[RT][2];
#pragma unroll
      for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int j = 2 * ch + q;
          M::afrag(r0[rt], t, j, w0[rt][q]);
          M::afrag(r1[rt], t, j, w1[rt][q]);
          tf_mma_k4_ws(r0[rt].h, j, k0[rt].d, k0[rt].dn, k0[rt].bd, k0[rt].bdn, ws0[rt][q], nws0[rt][q]);
          tf_mma_k4_ws(r1[rt].h, j, k1[rt].d, k1[rt].dn, k1[rt].bd, k1[rt].bdn, ws1[rt][q], nws1[rt][q]);
        }
#pragma unroll
      for (int T = 0; T < NT; ++T) {
        const int8_t* __restrict__ xp = xq + (xo[T] + bb * M::QK);
        float xd2[2][2];
        tf_mma_xd64<NT>(xd, co, T, bb, ch, xd2);
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          uint32_t b[2];
          M::xfrag(xp, t, 2 * ch + q, b);
          const float xdv[2] = {xd2[0][q], xd2[1][q]};
#pragma unroll
          for (int rt = 0; rt < RT; ++rt)
            tf_mma_group_lean(w0[rt][q], w1[rt][q], b, ws0[rt][q], nws0[rt][q], ws1[rt][q],
                              nws1[rt][q], xdv, acc[rt][T]);
        }
      }
    }
    // the block's min term: B = X of the lane's column (8T + g) at groups t, t + 4
#pragma unroll
    for (int T = 0; T < NT; ++T) {
      const int o = (xo[T] >> 5) + bb * 8 + t;              // xd index of (column, group t)
      const int2 s0 = *(const int2*)(xs16 + 2 * o), s4 = *(const int2*)(xs16 + 2 * o + 8);
      uint32_t bh[2], bl[2];
      tf_mma_tf32_split(xd[o] * (float)(s0.x + s0.y), bh[0], bl[0]);
      tf_mma_tf32_split(xd[o + 4] * (float)(s4.x + s4.y), bh[1], bl[1]);
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
        float m0a, m4a, m0b, m4b;
        tf_mma_k4_mins_t(r0[rt].h, t, m0a, m4a);
        tf_mma_k4_mins_t(r1[rt].h, t, m0b, m4b);
        const uint32_t a[4] = {__float_as_uint(m0a), __float_as_uint(m0b), __float_as_uint(m4a),
                               __float_as_uint(m4b)};
        float dm[4] = {0.f, 0.f, 0.f, 0.f};
        tf_mma_tf32(a, bh, dm);
        tf_mma_tf32(a, bl, dm);
        acc[rt][T][0] = fmaf(-k0[rt].dmin, dm[0], acc[rt][T][0]);
        acc[rt][T][1] = fmaf(-k0[rt].dmin, dm[1], acc[rt][T][1]);
        acc[rt][T][2] = fmaf(-k1[rt].dmin, dm[2], acc[rt][T][2]);
        acc[rt][T][3] = fmaf(-k1[rt].dmin, dm[3], acc[rt][T][3]);
      }
    }
  } else {
    // elements per chunk: 64; 32 for Q6_K at NT = 2, where 4 decoded groups x 2 tiles spilled
    constexpr int CE = (M::KS == 16 && NT * RT >= 2) ? 32 : 64;
    constexpr int GPC = CE / M::KS;         // groups per chunk
#pragma unroll
    for (int ch = 0; ch < M::QK / CE; ++ch) {
      uint32_t w0[RT][GPC][KW], w1[RT][GPC][KW];
      float ws0[RT][GPC], wm0[RT][GPC], ws1[RT][GPC], wm1[RT][GPC];
#pragma unroll
      for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int q = 0; q < GPC; ++q) {
          M::afrag(r0[rt], t, ch * GPC + q, w0[rt][q]);
          M::afrag(r1[rt], t, ch * GPC + q, w1[rt][q]);
          M::scale(r0[rt], ch * GPC + q, ws0[rt][q], wm0[rt][q]);
          M::scale(r1[rt], ch * GPC + q, ws1[rt][q], wm1[rt][q]);
        }
#pragma unroll
      for (int T = 0; T < NT; ++T) {
        const int8_t* __restrict__ xp = xq + (xo[T] + bb * M::QK);
        float xd2[2][CE / 32];
        int s4[2][CE / 16];
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int o = co[T][cc] + bb * (M::QK / 32) + (CE / 32) * ch;
          tf_mma_ldf<CE / 32>(xd + o, xd2[cc]);
          if constexpr (M::MINS) tf_mma_ldi<CE / 16>(xs16 + 2 * o, s4[cc]);
        }
#pragma unroll
        for (int q = 0; q < GPC; ++q) {
          const int j = ch * GPC + q;
          uint32_t b[KW];
          M::xfrag(xp, t, j, b);
          const int h = (M::KS * q) >> 5;   // 32-group of the chunk
          const float xdv[2] = {xd2[0][h], xd2[1][h]};
          int xs[2] = {0, 0};
          if constexpr (M::MINS) {
#pragma unroll
            for (int cc = 0; cc < 2; ++cc)
              xs[cc] = M::KS == 32 ? s4[cc][2 * q] + s4[cc][2 * q + 1] : s4[cc][q];
          }
#pragma unroll
          for (int rt = 0; rt < RT; ++rt)
            tf_mma_group<M>(w0[rt][q], w1[rt][q], b, ws0[rt][q], wm0[rt][q], ws1[rt][q],
                            wm1[rt][q], xdv, xs, acc[rt][T]);
        }
      }
    }
  }
}

// Store a finished tile: lane (g, t) holds rows g, g+8 x columns 8T + 2t, 8T + 2t + 1. Rows past
// n_out and columns past ncols are not stored.
template <int NT>
TF_DEV void tf_mma_flush(float* __restrict__ y, int n_out, int ncols, int row0, int t,
                         const float (&acc)[NT][4]) {
  const int row1 = row0 + 8;
#pragma unroll
  for (int T = 0; T < NT; ++T)
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
      const int c = 8 * T + 2 * t + cc;
      if (c < ncols) {
        float* p0 = y + (uint64_t)c * n_out + row0;
        if (row0 < n_out) *p0 = acc[T][cc];
        if (row1 < n_out) p0[8] = acc[T][2 + cc];
      }
    }
}

// ------------------------------------------------------------------ deterministic stream-K fixup
// Why: the split tiles used to be atomically added into a zeroed y, so their fp32 summation order
// followed the warps' timing (~1e-7 run to run), which the 64-layer model amplified into ~10 %
// different logits. Now every split tile group is summed by ONE warp in a fixed order.
// Workspace (gemv_mma.py allocates it once per device; the counters are zero at rest):
//   cnt  int32 [tile groups]: arrivals at each split tile group during the launch;
//   part fp32 [nw][2][TF_MMA_SLOT_FLOATS][32]: warp w's slot 0 = its piece of the FIRST tile group
//        of its item range, slot 1 = its piece of the LAST one (when different). Float f of lane l
//        at [f][l] (coalesced stores; every warp has the same fragment layout, so lane l of the
//        reducer reads the same positions of every slot). f = (rt * NT + T) * 4 + i of acc.
// Protocol of a warp that finishes tile group tg without covering it whole:
//   1. every lane stores its acc to its slot (L2 stores, __stcg), __syncwarp() (the stores happen
//      before ...);
//   2. lane 0: atom.release.gpu add on cnt[tg] (... this release; TF_MMA_LEGACY: fence.acq_rel +
//      relaxed atom.add, whose acquire half invalidated the SM's L1 at every arrival), and
//      broadcasts the old count;
//   3. P = the number of warps with items in tg (tf_mma_pieces); old != P - 1: done (not last);
//   4. last: fence.acq_rel.gpu (acquire), then sum the P slots (L2 loads, __ldcg) in ascending
//      warp order, store the sum plainly, and reset cnt[tg] = 0 for the next launch / replay.
// The result is the same fixed-order sum whoever arrives last (bitwise repeatable).
// Session 13: release arrivals, 32-bit split arithmetic and the conversions without I2F: 14.38 ms
// against 14.91 for session 11's code on the same machine.
// Cost (the 27B's verify block at M = 5, session 11): 14.86 ms against 12.80 with the atomics
// (each split group's arrival, a fence and an atomic round trip, and the last warp's P serial L2
// loads: P ~ 1 + warps / tile groups, ~7 on the FFN down matrix). Deferring every arrival to the end of the warp's range measured
// slower (15.70 ms: two reductions in every tail), issuing two pieces' loads at once spilled
// 20-200 bytes per kernel at the 128-register cap, and fence.sc (__threadfence) instead of
// acq_rel made no difference (14.76).
// gemv_mma.fixup_plan mirrors these integer formulas on the host (tests/test_gemv_mma.py).

// lane 0's arrival at a split tile group: the old count (relaxed: the caller's fence.acq_rel
// before it makes the pair a release of the warp's slot stores, ordered before it by __syncwarp;
// the fence after it, in the warp that arrives last, the acquire of the other pieces)
TF_DEV int tf_mma_arrive(int* c) {
  int old;
  asm volatile("atom.relaxed.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(c) : "memory");
  return old;
}
// The same arrival as a release atomic: it orders the warp's slot stores (made visible to it by
// __syncwarp, which orders memory among the warp's lanes) before the count, like the fence +
// relaxed pair, but without the fence's acquire half (fence.acq_rel.gpu compiles to MEMBAR +
// CCTL.IVALL: every arrival invalidated its SM's L1, where the other warps' x fragments live).
// Only the warp that arrives last needs the acquire, and takes it with tf_mma_fence().
TF_DEV int tf_mma_arrive_release(int* c) {
  int old;
  asm volatile("atom.release.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(c) : "memory");
  return old;
}
TF_DEV void tf_mma_fence() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// Sum the P pieces of tile group tg (this warp arrived last) in ascending warp order into acc,
// store them, reset the group's counter.
template <int RT, int NT>
TF_DEV void tf_mma_reduce(float* __restrict__ y, int n_out, int ncols, int tg, int g, int t,
                          tf_mma_ix items, tf_mma_ix nw, int spt, int* cnt, const float* part,
                          float (&acc)[RT][NT][4]) {
  constexpr int SLOT = TF_MMA_SLOT_FLOATS * 32;
  const int lane = 4 * g + t;
  const tf_mma_ix a = (tf_mma_ix)tg * spt;
  const int P = tf_mma_pieces(items, nw, spt, a);
  const tf_mma_ix wf = tf_mma_owner(items, nw, a);
  for (int k = 0; k < P; ++k) {                              // ascending warp order
    const tf_mma_ix v = tf_mma_piece(items, nw, a, wf, k);
    const float* p = part + (v * 2 + (k == 0 ? tf_mma_slot(items, nw, a, v) : 0)) * SLOT + lane;
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int T = 0; T < NT; ++T)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float x = __ldcg(p + ((rt * NT + T) * 4 + i) * 32);   // L2, not a stale L1 line
          acc[rt][T][i] = k == 0 ? x : acc[rt][T][i] + x;    // piece 0 as stored, then in order
        }
  }
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) tf_mma_flush<NT>(y, n_out, ncols, (tg * RT + rt) * 16 + g, t, acc[rt]);
  if (lane == 0) cnt[tg] = 0;         // all P pieces arrived: nobody else touches it this launch
}

// A warp's tile group tg is done: plain store when it covered the whole group, else the fixup
// protocol above. Inline on purpose: as a __noinline__ call the ABI's saved registers cost spills
// in the hot loop; here the cold branch reuses the step's dead decode registers. The split is
// recomputed from kernel parameters and special registers rather than kept live across the loop.
template <int RT, int NT>
TF_DEV void tf_mma_finish(float* __restrict__ y, int n_out, int ncols, int tg, int g, int t,
                          bool whole, int spt, int* cnt, float* part, float (&acc)[RT][NT][4]) {
  static_assert(RT * NT * 4 <= TF_MMA_SLOT_FLOATS, "slot too small for this accumulator");
  constexpr int SLOT = TF_MMA_SLOT_FLOATS * 32;
  if (!whole) {
    const int lane = 4 * g + t;
    // volatile reads: ptxas must not keep the kernel's own nw / gw live across the step loop
    uint32_t cta, ncta, tid;
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(cta));
    asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(ncta));
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
    const tf_mma_ix items = (tf_mma_ix)((n_out + 16 * RT - 1) / (16 * RT)) * spt;
    const tf_mma_ix nw = (tf_mma_ix)ncta * TF_MMA_WARPS;
    const tf_mma_ix gw = (tf_mma_ix)cta * TF_MMA_WARPS + (tid >> 5);
    const tf_mma_ix a = (tf_mma_ix)tg * spt;
    float* mine = part + (gw * 2 + tf_mma_slot(items, nw, a, gw)) * SLOT + lane;
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int T = 0; T < NT; ++T)
#pragma unroll
        for (int i = 0; i < 4; ++i) __stcg(mine + ((rt * NT + T) * 4 + i) * 32, acc[rt][T][i]);
    __syncwarp();
    int old = 0;
    if (lane == 0) {
#if TF_MMA_LEGACY
      tf_mma_fence();
      old = tf_mma_arrive(cnt + tg);
#else
      old = tf_mma_arrive_release(cnt + tg);
#endif
    }
    old = __shfl_sync(0xffffffffu, old, 0);
    if (old != tf_mma_pieces(items, nw, spt, a) - 1) return;   // warp-uniform: not the last
    if (lane == 0) tf_mma_fence();          // acquire: the other pieces' slot stores are visible
    __syncwarp();
    tf_mma_reduce<RT, NT>(y, n_out, ncols, tg, g, t, items, nw, spt, cnt, part, acc);
    return;
  }
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) tf_mma_flush<NT>(y, n_out, ncols, (tg * RT + rt) * 16 + g, t, acc[rt]);
}

// tf_mma: one 16-row tile per warp (the default; kept apart from tf_mma_rt's general form, with
// which ptxas spilled a few bytes at RT = 1).
// Work split ("stream-K"): a work item is one step = U consecutive blocks of one 16-row tile
// (items tile*spt .. tile*spt + spt - 1, spt = ceil(nb / U)); the launch's nw warps take equal
// contiguous item ranges [I*w/nw, I*(w+1)/nw), I = tiles*spt. gemv_mma.py sizes the grid to one
// wave of resident warps with ~equal items per warp, so there is no tail wave (a 16-row tile per
// warp with a fixed K split left up to half the SMs idle in a second wave). A warp accumulates
// along its range in registers and flushes at every tile change: a plain store when it covered the
// whole tile, else the deterministic fixup (tf_mma_finish: slot, arrival count, the last warp sums
// the pieces in ascending warp order), so y needs no zeroing and results are bitwise repeatable.
// Inside a tile the 4 lanes of a row read 32 contiguous bytes per load and consecutive steps walk
// the row's bytes in order; each step issues the U blocks' loads for both rows before the first mma.
// Rows past n_out compute on row n_out-1's weights and are never stored. Columns: ncols <= 8*NT;
// B columns past ncols read column ncols-1 and are never stored.
template <class M, int NT>
__global__ void __launch_bounds__(TF_MMA_THREADS, TF_MMA_MINB)
tf_mma(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq, const float* __restrict__ xd,
       const int* __restrict__ xs16, float* __restrict__ y, int n_out, int K, int ncols,
       int* cnt, float* part) {
  constexpr int U = tf_mma_u<M, NT>::U;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int nb = K / M::QK;
  const int spt = (nb + U - 1) / U;
  const int tiles = (n_out + 15) >> 4;
  const tf_mma_ix items = (tf_mma_ix)tiles * spt;
  int it, iend;
  tf_mma_warp_range(items, it, iend);
  // offsets fit in int: N <= 16 columns of K < 2^26 elements
  int xo[NT], co[NT][2];
#pragma unroll
  for (int T = 0; T < NT; ++T) {
    const int cb = 8 * T + g;
    xo[T] = (cb < ncols ? cb : ncols - 1) * K;
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
      const int ce0 = 8 * T + 2 * t + cc, ce = ce0 < ncols ? ce0 : ncols - 1;
      co[T][cc] = ce * (K >> 5);
    }
  }
  while (it < iend) {                                        // warp-uniform
    const int tile = it / spt, s0 = it - tile * spt;
    const int s1 = spt < s0 + (iend - it) ? spt : s0 + (iend - it);
    const int row0 = tile * 16 + g, row1 = row0 + 8;
    const uint8_t* __restrict__ wr0 = W + (uint64_t)(row0 < n_out ? row0 : n_out - 1) * nb * M::BB;
    const uint8_t* __restrict__ wr1 = W + (uint64_t)(row1 < n_out ? row1 : n_out - 1) * nb * M::BB;
    float acc[1][NT][4];
#pragma unroll
    for (int T = 0; T < NT; ++T)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[0][T][i] = 0.f;
    for (int b = s0 * U; b < s1 * U; b += U) {
      typename M::Raw r0[U][1], r1[U][1];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (b + u < nb) {
          M::load(wr0 + (uint64_t)(b + u) * M::BB, t, r0[u][0]);
          M::load(wr1 + (uint64_t)(b + u) * M::BB, t, r1[u][0]);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (b + u < nb) tf_mma_block<M, NT, 1>(r0[u], r1[u], t, b + u, xq, xd, xs16, xo, co, acc);
    }
    tf_mma_finish<1, NT>(y, n_out, ncols, tile, g, t, s0 == 0 && s1 == spt, spt, cnt, part,
                         acc);
    it += s1 - s0;
  }
}

// tf_mma_rt (opt-in, gemv_mma.py config "rt": 2; instantiated at NT = 1, RT = 2): tf_mma with
// RT row tiles per warp, so each x fragment and column scale load serves 16*RT rows.
// Work split ("stream-K"): a work item is one step = U consecutive blocks of one group of RT
// 16-row tiles (16*RT rows; items tg*spt .. tg*spt + spt - 1, spt = ceil(nb / U)); the launch's nw
// warps take equal contiguous item ranges [I*w/nw, I*(w+1)/nw), I = tile groups * spt.
// gemv_mma.py sizes the grid to one wave of resident warps with ~equal items per warp, so there is
// no tail wave (a 16-row tile per warp with a fixed K split left up to half the SMs idle in a
// second wave: measured 2x). A warp accumulates along its range in registers and flushes at every
// tile-group change: a plain store when it covered the whole group, else the deterministic fixup
// (tf_mma_finish; cnt / part: gemv_mma.py's per-device workspace).
// Inside a tile the 4 lanes of a row read 32 contiguous bytes per load and consecutive steps walk
// the row's bytes in order; each step issues the U blocks' loads for all 2*RT rows of the lane
// before the first mma. Rows past n_out compute on row n_out-1's weights and are never stored.
// Columns: ncols <= 8*NT; B columns past ncols read column ncols-1 and are never stored.
template <class M, int NT, int RT>
__global__ void __launch_bounds__(TF_MMA_THREADS, TF_MMA_MINB)
tf_mma_rt(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq, const float* __restrict__ xd,
       const int* __restrict__ xs16, float* __restrict__ y, int n_out, int K, int ncols,
       int* cnt, float* part) {
  constexpr int U = tf_mma_u<M, NT, RT>::U;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int nb = K / M::QK;
  const int spt = (nb + U - 1) / U;
  const int groups = (n_out + 16 * RT - 1) / (16 * RT);
  const tf_mma_ix items = (tf_mma_ix)groups * spt;
  int it, iend;
  tf_mma_warp_range(items, it, iend);
  // offsets fit in int: N <= 16 columns of K < 2^26 elements
  int xo[NT], co[NT][2];
#pragma unroll
  for (int T = 0; T < NT; ++T) {
    const int cb = 8 * T + g;
    xo[T] = (cb < ncols ? cb : ncols - 1) * K;
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
      const int ce0 = 8 * T + 2 * t + cc, ce = ce0 < ncols ? ce0 : ncols - 1;
      co[T][cc] = ce * (K >> 5);
    }
  }
  while (it < iend) {                                        // warp-uniform
    const int tg = it / spt, s0 = it - tg * spt;
    const int s1 = spt < s0 + (iend - it) ? spt : s0 + (iend - it);
    const uint8_t* __restrict__ wr0[RT];
    const uint8_t* __restrict__ wr1[RT];
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      const int ra = (tg * RT + rt) * 16 + g, rb = ra + 8;
      wr0[rt] = W + (uint64_t)(ra < n_out ? ra : n_out - 1) * nb * M::BB;
      wr1[rt] = W + (uint64_t)(rb < n_out ? rb : n_out - 1) * nb * M::BB;
    }
    float acc[RT][NT][4];
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int T = 0; T < NT; ++T)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[rt][T][i] = 0.f;
    for (int b = s0 * U; b < s1 * U; b += U) {
      typename M::Raw r0[U][RT], r1[U][RT];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (b + u < nb) {
#pragma unroll
          for (int rt = 0; rt < RT; ++rt) {
            M::load(wr0[rt] + (uint64_t)(b + u) * M::BB, t, r0[u][rt]);
            M::load(wr1[rt] + (uint64_t)(b + u) * M::BB, t, r1[u][rt]);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (b + u < nb) tf_mma_block<M, NT, RT>(r0[u], r1[u], t, b + u, xq, xd, xs16, xo, co, acc);
    }
    tf_mma_finish<RT, NT>(y, n_out, ncols, tg, g, t, s0 == 0 && s1 == spt, spt, cnt, part,
                          acc);
    it += s1 - s0;
  }
}
#endif  // TF_DEVICE
