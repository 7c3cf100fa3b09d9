// tightfit CUDA GEMV: low-bit block formats (CONTRACT.md): Q2_K Q3_K IQ2_XXS IQ2_XS IQ2_S
// IQ3_XXS IQ3_S TQ1_0 TQ2_0 Q1_0 Q2_0.
// Written from the block layouts in /work/shared/spec/quant-formats.md §2 (oracle: gguf-py
// gguf.quants; tightfit/quant/*.py). Needs the tables of tightfit/kernels/cuda/tables.py
// (tf_iq2xxs_grid, tf_iq2xs_grid, tf_iq2s_grid, tf_iq3xxs_grid, tf_iq3s_grid, tf_sign_mask64).
//
// Every part (lane) of a block covers exactly one 32-element group of the block (part p =
// elements 32p..32p+31), so each lane needs one activation scale xd per column and the per-part
// integer sum is scaled once. Codes are built as 32-bit words of 4 int8 weights (SWAR) and
// reduced with tf_dp4a; code offsets (Q3_K +4, TQ*/Q2_0 -1, Q1_0 2b-1) and Q2_K mins are taken
// out through the activations' 16-sums.
//
// Instruction estimates, per weight, for one lane (NC = 1). "decode" = everything that depends
// only on the weights (loads, unpack, scales); "+col" = per column (x loads, dp4a, the scale
// fma), amortised over the part's 32 weights: two 16-byte x loads + 8 dp4a + ~5 scalar
// ops ~= 15/32 ~= 0.47 per weight per column (0.5 with two 16-sums).
//   Q2_K    decode ~ 8 ld + 16 (shr, and) + ~10 scales/d = 34/32 ~ 1.05   +col ~0.55
//   Q3_K    decode ~ 18 ld + 16 shf (2-byte aligned) + 8x4 (shr, shr, and, shl|lop3)
//                    + ~14 scales = 80/32 ~ 2.5                           +col ~0.55
//   TQ2_0   decode ~ 9 ld + 8 shf + 16 = 33/32 ~ 1.0                      +col ~0.5
//   TQ1_0   decode ~ 10 ld + 8 shf + 8x9 trit SWAR + ~12 selects = 102/32 ~ 3.2  +col ~0.5
//   IQ2_XXS decode ~ 3 ld + 2 shf, per 8 weights: 2 index extracts, 2 address, 2 gathers
//                    (grid u64, sign u64), 6 sign apply (xor, and, add per word)
//                    -> (5 + 4x12)/32 ~ 1.65                              +col ~0.47
//   IQ2_XS  as IQ2_XXS, two scales: ~1.7                                  +col ~0.5
//   IQ2_S   as IQ2_XS plus 2 ops per group for the 2 high index bits: ~1.9   +col ~0.5
//   IQ3_XXS per 8 weights 2 grid gathers (u32) + 1 sign gather: ~1.8      +col ~0.47
//   IQ3_S   per 8 weights 2 grid gathers + 2x2 high-bit ops + 1 sign gather: ~2.1  +col ~0.47
//   Q1_0    decode ~ 3 ld + 8x4 (shr, and, imad, and) = 35/32 ~ 1.1       +col ~0.5
//   Q2_0    decode ~ 5 ld + 8x5 (byte extract, imad, and, imad, and) = 45/32 ~ 1.4   +col ~0.5
// The IQ gathers are random-index table reads: they cost L1/shared wavefronts, not issue slots,
// and are the likely limiter of the IQ formats (see tables.py for the memory-space discussion).
#pragma once

#define TF_LB_M3 0x03030303u
#define TF_LB_M1 0x01010101u

// ---------------------------------------------------------------- shared helpers

// 32 activations of column c at xp (16-byte aligned): S0 = sum over elements 0..15 of w*x,
// S1 = over 16..31.
TF_DEV void tf_lb_dot16x2(const uint32_t (&w)[8], const int8_t* xp, int& s0, int& s1) {
  uint32_t x0[4], x1[4];
  tf_ld_x16(xp, x0);
  tf_ld_x16(xp + 16, x1);
  int a = 0, b = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    a = tf_dp4a((int)w[i], (int)x0[i], a);
    b = tf_dp4a((int)w[4 + i], (int)x1[i], b);
  }
  s0 = a;
  s1 = b;
}

// The same as one sum, starting from s.
TF_DEV int tf_lb_dot32(const uint32_t (&w)[8], const int8_t* xp, int s) {
  uint32_t x0[4], x1[4];
  tf_ld_x16(xp, x0);
  tf_ld_x16(xp + 16, x1);
#pragma unroll
  for (int i = 0; i < 4; ++i) s = tf_dp4a((int)w[i], (int)x0[i], s);
#pragma unroll
  for (int i = 0; i < 4; ++i) s = tf_dp4a((int)w[4 + i], (int)x1[i], s);
  return s;
}

// Signed bytes from magnitudes g (1..127 per byte) and a 0x00/0xFF mask per byte:
// (g ^ 0xFF) + 1 = -g byte by byte, never carrying into the next byte because g >= 1.
TF_DEV uint32_t tf_lb_sgn(uint32_t g, uint32_t m) { return (g ^ m) + (m & TF_LB_M1); }

// 3^t for t in 0..4 (two selects and a multiply: no local-memory array)
TF_DEV uint32_t tf_lb_pow3(uint32_t t) {
  uint32_t a = (t & 1u) ? 3u : 1u;
  uint32_t b = (t & 2u) ? 9u : 1u;
  return (t & 4u) ? 81u : a * b;
}

// TQ1_0 trit plane: byte k of w holds b_k; result byte k = t(b_k) = ((b_k*m mod 256)*3) >> 8
// for m = 3^n. Even and odd bytes go to 16-bit fields (b*m <= 255*81 fits), 3*(b*m mod 256)
// <= 765 keeps the trit in bits 8-9 of each field, which one byte_perm collects.
TF_DEV uint32_t tf_lb_trits(uint32_t w, uint32_t m) {
  uint32_t e = w & 0x00FF00FFu;
  uint32_t o = tf_byte_perm(w, 0u, 0x4341u);        // bytes 1, 3 -> fields 0, 1
  e = ((e * m) & 0x00FF00FFu) * 3u;
  o = ((o * m) & 0x00FF00FFu) * 3u;
  return tf_byte_perm(e, o, 0x7351u);               // byte 1 of each field, interleaved
}

// ---------------------------------------------------------------- Q2_K (type 10)
// scales[16] @0 (low nibble scale, high nibble min, per 16), qs[64] @16 (crumb planes),
// d f16 @80, dmin f16 @82.  w = d*sc*q - dmin*m.  Part p: half h = p/4, crumb n = p%4, i.e.
// bits 2n of bytes qs[32h..32h+31] (element 32p + byte index); 16-groups 2p, 2p+1.
struct F_Q2_K {
  static constexpr int TYPE = 10, QK = 256, BB = 84, PARTS = 8;
  template <int NC>
  TF_DEV static void dot(const uint8_t* __restrict__ blk, int part, const int8_t* __restrict__ xq,
                         const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                         float (&acc)[NC]) {
    const int h = part >> 2, n = part & 3;
    uint32_t q[8];
    tf_ld_words<4, 8>(blk + 16 + 32 * h, q);
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = (q[i] >> (2 * n)) & TF_LB_M3;
    const uint32_t sc = tf_ld_u16(blk + 2 * part);
    const int sc0 = sc & 15, m0 = (sc >> 4) & 15, sc1 = (sc >> 8) & 15, m1 = (sc >> 12) & 15;
    const uint32_t dd = tf_ld_u32(blk + 80);
    const float d = tf_h2f((uint16_t)(dd & 0xFFFFu)), dmin = tf_h2f((uint16_t)(dd >> 16));
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      int s0, s1;
      tf_lb_dot16x2(q, xq + c * K + 32 * part, s0, s1);
      const int* s16 = xs16 + c * (K / 16) + 2 * part;
      const int isum = sc0 * s0 + sc1 * s1;
      const int imin = m0 * s16[0] + m1 * s16[1];
      acc[c] += xd[c * (K / 32) + part] * (d * (float)isum - dmin * (float)imin);
    }
  }
};

// ---------------------------------------------------------------- Q3_K (type 11)
// hmask[32] @0, qs[64] @32 (crumb planes), scales[12] @96 (6-bit, -32), d f16 @108.
// q = low - 4*(!hbit) = (low | hbit<<2) - 4: the word holds low | hbit<<2 (0..7) and the -4
// goes through the 16-sums.  Part p: crumb plane p%4 of half p/4, hmask bit p.
struct F_Q3_K {
  static constexpr int TYPE = 11, QK = 256, BB = 110, PARTS = 8;
  template <int NC>
  TF_DEV static void dot(const uint8_t* __restrict__ blk, int part, const int8_t* __restrict__ xq,
                         const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                         float (&acc)[NC]) {
    const int h = part >> 2, n = part & 3;
    uint32_t hm[8], q[8];
    tf_ld_words<2, 8>(blk, hm);
    tf_ld_words<2, 8>(blk + 32 + 32 * h, q);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      q[i] = ((q[i] >> (2 * n)) & TF_LB_M3) | (((hm[i] >> part) & TF_LB_M1) << 2);
    // 6-bit scales of 16-groups s = 2p, 2p+1: low nibbles in bytes s%8 (shift 4*(s/8)),
    // high crumbs in bytes 8 + s%4 (shift 2*(s/4)); both pairs are adjacent bytes.
    const uint32_t lo = (tf_ld_u16(blk + 96 + ((2 * part) & 7)) >> (4 * (part >> 2))) & 0x0F0Fu;
    const uint32_t hi = (tf_ld_u16(blk + 104 + ((2 * part) & 3)) >> (2 * (part >> 1))) & 0x0303u;
    const uint32_t v = lo | (hi << 4);
    const int sc0 = (int)(v & 0xFFu) - 32, sc1 = (int)(v >> 8) - 32;
    const float d = tf_h2f((uint16_t)tf_ld_u16(blk + 108));
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      int s0, s1;
      tf_lb_dot16x2(q, xq + c * K + 32 * part, s0, s1);
      const int* s16 = xs16 + c * (K / 16) + 2 * part;
      const int isum = sc0 * (s0 - 4 * s16[0]) + sc1 * (s1 - 4 * s16[1]);
      acc[c] += d * xd[c * (K / 32) + part] * (float)isum;
    }
  }
};

// ---------------------------------------------------------------- TQ2_0 (type 35)
// qs[64] @0 (crumb planes), d f16 @64.  w = d*(q-1).
struct F_TQ2_0 {
  static constexpr int TYPE = 35, QK = 256, BB = 66, PARTS = 8;
  template <int NC>
  TF_DEV static void dot(const uint8_t* __restrict__ blk, int part, const int8_t* __restrict__ xq,
                         const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                         float (&acc)[NC]) {
    const int h = part >> 2, n = part & 3;
    uint32_t q[8];
    tf_ld_words<2, 8>(blk + 32 * h, q);
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = (q[i] >> (2 * n)) & TF_LB_M3;
    const float d = tf_h2f((uint16_t)tf_ld_u16(blk + 64));
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int* s16 = xs16 + c * (K / 16) + 2 * part;
      const int s = tf_lb_dot32(q, xq + c * K + 32 * part, -(s16[0] + s16[1]));
      acc[c] += d * xd[c * (K / 32) + part] * (float)s;
    }
  }
};

// ---------------------------------------------------------------- TQ1_0 (type 34)
// qs[48] @0 (5 trits per byte: a 32-byte stage then a 16-byte stage), qh[4] @48 (4 trits per
// byte), d f16 @52.  w = d*(t-1).  Part p, words 0-3 ("A") and 4-7 ("B"):
//   p < 5 : A = trit p of qs[0..15],   B = trit p of qs[16..31]
//   p = 5,6: A = trit 2(p-5) of qs[32..47], B = trit 2(p-5)+1 of qs[32..47]
//   p = 7 : A = trit 4 of qs[32..47],  B = trit i (word 4+i) of qh[0..3]
// All lanes run the same loads (offsets and multipliers are selects).
struct F_TQ1_0 {
  static constexpr int TYPE = 34, QK = 256, BB = 54, PARTS = 8;
  template <int NC>
  TF_DEV static void dot(const uint8_t* __restrict__ blk, int part, const int8_t* __restrict__ xq,
                         const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                         float (&acc)[NC]) {
    const bool s1 = part < 5, p7 = part == 7;
    const int oa = s1 ? 0 : 32;
    const int ob = s1 ? 16 : (p7 ? 36 : 32);      // p = 7 reads qs[36..51]: its word 3 is qh
    const uint32_t ta = s1 ? part : (p7 ? 4 : 2 * (part - 5));
    const uint32_t tb = s1 ? part : 2 * (part - 5) + 1;
    uint32_t wa[4], wb[4];
    tf_ld_words<2, 4>(blk + oa, wa);
    tf_ld_words<2, 4>(blk + ob, wb);
    const uint32_t ma = tf_lb_pow3(ta), mb = tf_lb_pow3(tb);
    uint32_t q[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      q[i] = tf_lb_trits(wa[i], ma);
      const uint32_t mbi = p7 ? (uint32_t)(i == 0 ? 1 : i == 1 ? 3 : i == 2 ? 9 : 27) : mb;
      q[4 + i] = tf_lb_trits(p7 ? wb[3] : wb[i], mbi);
    }
    const float d = tf_h2f((uint16_t)tf_ld_u16(blk + 52));
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int* s16 = xs16 + c * (K / 16) + 2 * part;
      const int s = tf_lb_dot32(q, xq + c * K + 32 * part, -(s16[0] + s16[1]));
      acc[c] += d * xd[c * (K / 32) + part] * (float)s;
    }
  }
};

// ---------------------------------------------------------------- IQ helpers
// The IQ formats are gather-bound: every 8 (IQ2) or 4 (IQ3) weights read a table entry at a
// per-lane random index, and L1 serves such a gather one 128-byte line at a time. So the grids
// are 16-bit code words (tables.py: at most 2 KiB per grid instead of 8 KiB) turned into weight
// bytes with byte_perm (PRMT) lookups, and the signs are computed from their bits instead of read
// from a mask table. Integer results are identical to the grid * sign products.

// PTX prmt.b32 (default mode): result byte k = byte (s >> 4k) & 7 of {b:a}, and when bit 3 of
// that nibble is set, the selected byte's bit 7 replicated (0x00 / 0xFF). Not __byte_perm: CUDA
// defines __byte_perm on the low 3 bits of each nibble only (nvcc masks the selector with 0x7777,
// one extra LOP3 per call, and the sign mode is lost). The host emulation tf_byte_perm implements
// the PTX semantics. Plain (non-volatile) asm: no side effects, can be CSE'd.
TF_DEV uint32_t tf_lb_prmt(uint32_t a, uint32_t b, uint32_t s) {
#if TF_DEVICE
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
  return r;
#else
  return tf_byte_perm(a, b, s);
#endif
}

// byte k of w, zero-extended: one PRMT (a shift + mask would be two ops).
TF_DEV uint32_t tf_lb_byte(uint32_t w, int k) { return tf_lb_prmt(w, 0u, 0x4440u | (uint32_t)k); }

TF_DEV uint32_t tf_lb_popc(uint32_t v) {
#if TF_DEVICE
  return (uint32_t)__popc(v);
#else
  return (uint32_t)__builtin_popcount(v);
#endif
}

// 2-byte aligned 8 bytes -> a[0], a[1]: four 16-bit loads (LDG.U16.CONSTANT, immediate offsets
// from one address). An aligned-word + funnel-shift version saves one load but costs ~6 issue
// slots of address/select work and made ptxas spill at NC >= 2.
TF_DEV void tf_lb_ld8_a2(const uint8_t* __restrict__ p, uint32_t (&a)[2]) {
  a[0] = tf_ld_u32_a2(p);
  a[1] = tf_ld_u32_a2(p + 4);
}

// ---- IQ2 (grids of 3 magnitudes): one PRMT per 4 weights, sign included.
// Selector nibble j = code_j | sign_j << 2 picks byte code_j of TF_IQ2_LUT_P (magnitude) or of
// TF_IQ2_LUT_N (its negative). tf_iq2*_g16 holds code j (j < 4) at bits 4j and code j+4 at 4j+2,
// so e | e << 14 moves codes 4..7 to nibbles 4..7.

// Signs: sign j must land on bit 4j+2 of the selector. Even and odd sign bits are spread by
// separate multiplies so that overlapping partial products only ever carry into bits that are
// not read: (s & 0x55) * 0x00104104 puts s_2i at bit 8i+2, (s & 0xAA) * 0x00820820 puts s_2i+1 at
// bit 8i+6; everything else in the products is junk that the masks below drop.
struct tf_lb_sgn2 { uint32_t ev, od; };

// Explicit sign byte (bit j = element j; bits above 7 ignored).
TF_DEV tf_lb_sgn2 tf_lb_sgn_nib(uint32_t s) {
  return {(s & 0x55u) * 0x00104104u, (s & 0xAAu) * 0x00820820u};
}

// 7-bit ksigns index k = (w >> sh) & 0x7F (IQ2_XXS, IQ2_XS): signs 0..6 are its bits, sign 7
// its parity (popc is shift-invariant, so it counts the field in place). The parity lands at bit
// 30 (element 7); popc's bit 1 lands at bit 31, which the mask drops.
TF_DEV tf_lb_sgn2 tf_lb_ksgn_nib(uint32_t w, int sh) {
  const uint32_t k = w >> sh;
  return {(k & 0x55u) * 0x00104104u,
          (k & 0x2Au) * 0x00820820u + (tf_lb_popc(w & (0x7Fu << sh)) << 30)};
}

// 8 weights from a code word e and its signs: three LOP3 build the selector (codes, then the
// masked even and odd signs), two PRMT the weight words.
TF_DEV void tf_lb_iq2_w8(uint32_t e, tf_lb_sgn2 sn, uint32_t& w0, uint32_t& w1) {
  uint32_t sel = (e | (e << 14)) & 0x33333333u;
  sel = (sn.ev & 0x04040404u) | sel;
  sel = (sn.od & 0x40404040u) | sel;
  w0 = tf_lb_prmt(TF_IQ2_LUT_P, TF_IQ2_LUT_N, sel);
  w1 = tf_lb_prmt(TF_IQ2_LUT_P, TF_IQ2_LUT_N, sel >> 16);
}

// ---- IQ3 (grids of 8 magnitudes): the code nibble is a full PRMT selector, so magnitudes and
// negatives are two lookups and the sign mask picks bytes between them.
// 4 sign bits -> 0x00/0xFF byte mask: (s & 0x0F) * 0x10204080 puts s_j at bit 8j+7 (the four
// partial products do not overlap) and selector nibble 8+j replicates bit 7 of byte j.
// (s & 0xF0) * 0x01020408 does the same for bits 4..7.
TF_DEV uint32_t tf_lb_mask_lo(uint32_t s) { return tf_lb_prmt((s & 0x0Fu) * 0x10204080u, 0u, 0xBA98u); }
TF_DEV uint32_t tf_lb_mask_hi(uint32_t s) { return tf_lb_prmt((s & 0xF0u) * 0x01020408u, 0u, 0xBA98u); }

template <uint32_t P0, uint32_t P1, uint32_t N0, uint32_t N1>
TF_DEV uint32_t tf_lb_iq3_w4(uint32_t e, uint32_t m) {
  const uint32_t p = tf_lb_prmt(P0, P1, e), n = tf_lb_prmt(N0, N1, e);
  return (p & ~m) | (n & m);
}

// ---------------------------------------------------------------- IQ2_XXS (type 16)
// d f16 @0, then per 32-group ib 8 bytes @2+8ib: u32 of four 8-bit grid indices, u32 of four
// 7-bit sign indices (bits 7l..7l+6) and the scale s (bits 28..31).  w = d*(2s+1)/8*grid*sign.
struct F_IQ2_XXS {
  static constexpr int TYPE = 16, QK = 256, BB = 66, PARTS = 8;
  template <int NC>
  TF_DEV static void dot(const uint8_t* __restrict__ blk, int part, const int8_t* __restrict__ xq,
                         const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                         float (&acc)[NC]) {
    (void)xs16;
    uint32_t a[2];
    tf_lb_ld8_a2(blk + 2 + 8 * (uint32_t)part, a);
    uint32_t q[8];
#pragma unroll
    for (int l = 0; l < 4; ++l)
      tf_lb_iq2_w8(tf_iq2xxs_g16[tf_lb_byte(a[0], l)], tf_lb_ksgn_nib(a[1], 7 * l),
                   q[2 * l], q[2 * l + 1]);
    const float dl = tf_h2f((uint16_t)tf_ld_u16(blk)) * 0.125f * (float)(2 * (a[1] >> 28) + 1);
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int s = tf_lb_dot32(q, xq + c * K + 32 * part, 0);
      acc[c] += dl * xd[c * (K / 32) + part] * (float)s;
    }
  }
};

// ---------------------------------------------------------------- IQ2_XS (type 17)
// d f16 @0, qs u16[32] @2 (9-bit grid index | 7-bit sign index << 9, one per 8 elements),
// scales[8] @66 (per 32-group: low nibble for groups 0-1, high nibble for groups 2-3).
// w = d*(2*nib+1)/8*grid*sign.
struct F_IQ2_XS {
  static constexpr int TYPE = 17, QK = 256, BB = 74, PARTS = 8;
  template <int NC>
  TF_DEV static void dot(const uint8_t* __restrict__ blk, int part, const int8_t* __restrict__ xq,
                         const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                         float (&acc)[NC]) {
    (void)xs16;
    uint32_t a[2];
    tf_lb_ld8_a2(blk + 2 + 8 * (uint32_t)part, a);
    uint32_t q[8];
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const uint32_t w = a[l >> 1], sh = 16 * (l & 1);
      tf_lb_iq2_w8(tf_iq2xs_g16[(w >> sh) & 511u], tf_lb_ksgn_nib(w, sh + 9), q[2 * l], q[2 * l + 1]);
    }
    const uint32_t sb = blk[66 + part];
    const int ls0 = 2 * (int)(sb & 15u) + 1, ls1 = 2 * (int)(sb >> 4) + 1;
    const float d8 = tf_h2f((uint16_t)tf_ld_u16(blk)) * 0.125f;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      int s0, s1;
      tf_lb_dot16x2(q, xq + c * K + 32 * part, s0, s1);
      acc[c] += d8 * xd[c * (K / 32) + part] * (float)(ls0 * s0 + ls1 * s1);
    }
  }
};

// ---------------------------------------------------------------- IQ2_S (type 22)
// d f16 @0, qs[32] @2 (low 8 index bits), signs[32] @34 (explicit sign bytes), qh[8] @66
// (bits 2l..2l+1 = index bits 8-9 of group l), scales[8] @74 (as IQ2_XS).
struct F_IQ2_S {
  static constexpr int TYPE = 22, QK = 256, BB = 82, PARTS = 8;
  template <int NC>
  TF_DEV static void dot(const uint8_t* __restrict__ blk, int part, const int8_t* __restrict__ xq,
                         const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                         float (&acc)[NC]) {
    (void)xs16;
    const uint8_t* bp = blk + 4 * (uint32_t)part;
    const uint32_t qs = tf_ld_u32_a2(bp + 2), sg = tf_ld_u32_a2(bp + 34);
    const uint32_t qh = blk[66 + part], sb = blk[74 + part];
    uint32_t q[8];
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const uint32_t gi = tf_lb_byte(qs, l) | ((qh << (8 - 2 * l)) & 0x300u);
      tf_lb_iq2_w8(tf_iq2s_g16[gi], tf_lb_sgn_nib(sg >> (8 * l)), q[2 * l], q[2 * l + 1]);
    }
    const int ls0 = 2 * (int)(sb & 15u) + 1, ls1 = 2 * (int)(sb >> 4) + 1;
    const float d8 = tf_h2f((uint16_t)tf_ld_u16(blk)) * 0.125f;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      int s0, s1;
      tf_lb_dot16x2(q, xq + c * K + 32 * part, s0, s1);
      acc[c] += d8 * xd[c * (K / 32) + part] * (float)(ls0 * s0 + ls1 * s1);
    }
  }
};

// ---------------------------------------------------------------- IQ3_XXS (type 18)
// d f16 @0, 8 grid-index bytes per 32-group @2+8ib (two per 8 elements), u32 per 32-group @66+4ib
// (7-bit sign index of group l at bits 7l, scale s at bits 28..31).  w = d*(2s+1)/4*grid*sign.
struct F_IQ3_XXS {
  static constexpr int TYPE = 18, QK = 256, BB = 98, PARTS = 8;
  template <int NC>
  TF_DEV static void dot(const uint8_t* __restrict__ blk, int part, const int8_t* __restrict__ xq,
                         const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                         float (&acc)[NC]) {
    (void)xs16;
    uint32_t a[2];
    tf_lb_ld8_a2(blk + 2 + 8 * (uint32_t)part, a);
    const uint32_t aux = tf_ld_u32_a2(blk + 66 + 4 * (uint32_t)part);
    uint32_t q[8];
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const uint32_t w = a[l >> 1];
      const int b0 = 2 * (l & 1);
      const uint32_t k = aux >> (7 * l);
      // sign 7 = parity of the 7 index bits: popc's bit 0 times 2^31 lands on bit 7 of byte 3
      const uint32_t m0 = tf_lb_mask_lo(k);
      const uint32_t m1 = tf_lb_prmt((k & 0x70u) * 0x01020408u
                                       + (tf_lb_popc(aux & (0x7Fu << (7 * l))) << 31), 0u, 0xBA98u);
      q[2 * l] = tf_lb_iq3_w4<TF_IQ3XXS_LUT_P0, TF_IQ3XXS_LUT_P1, TF_IQ3XXS_LUT_N0, TF_IQ3XXS_LUT_N1>(
          tf_iq3xxs_g16[tf_lb_byte(w, b0)], m0);
      q[2 * l + 1] = tf_lb_iq3_w4<TF_IQ3XXS_LUT_P0, TF_IQ3XXS_LUT_P1, TF_IQ3XXS_LUT_N0, TF_IQ3XXS_LUT_N1>(
          tf_iq3xxs_g16[tf_lb_byte(w, b0 + 1)], m1);
    }
    const float dl = tf_h2f((uint16_t)tf_ld_u16(blk)) * 0.25f * (float)(2 * (aux >> 28) + 1);
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int s = tf_lb_dot32(q, xq + c * K + 32 * part, 0);
      acc[c] += dl * xd[c * (K / 32) + part] * (float)s;
    }
  }
};

// ---------------------------------------------------------------- IQ3_S (type 21)
// d f16 @0, qs[64] @2 (low 8 index bits, 8 per 32-group), qh[8] @66 (bit k = 9th bit of index
// k of the group), signs[32] @74 (one explicit byte per 8 elements), scales[4] @106 (nibble per
// 32-group).  w = d*(1+2*sc)*grid*sign.
struct F_IQ3_S {
  static constexpr int TYPE = 21, QK = 256, BB = 110, PARTS = 8;
  template <int NC>
  TF_DEV static void dot(const uint8_t* __restrict__ blk, int part, const int8_t* __restrict__ xq,
                         const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                         float (&acc)[NC]) {
    (void)xs16;
    uint32_t a[2];
    tf_lb_ld8_a2(blk + 2 + 8 * (uint32_t)part, a);
    const uint32_t qh = blk[66 + part];
    const uint32_t sg = tf_ld_u32_a2(blk + 74 + 4 * (uint32_t)part);
    const uint32_t sc = ((uint32_t)blk[106 + (part >> 1)] >> (4 * (part & 1))) & 15u;
    uint32_t q[8];
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const uint32_t w = a[l >> 1];
      const int b0 = 2 * (l & 1);
      const uint32_t s = sg >> (8 * l);
      const uint32_t i1 = tf_lb_byte(w, b0) | ((qh << (8 - 2 * l)) & 0x100u);
      const uint32_t i2 = tf_lb_byte(w, b0 + 1) | ((qh << (7 - 2 * l)) & 0x100u);
      q[2 * l] = tf_lb_iq3_w4<TF_IQ3S_LUT_P0, TF_IQ3S_LUT_P1, TF_IQ3S_LUT_N0, TF_IQ3S_LUT_N1>(
          tf_iq3s_g16[i1], tf_lb_mask_lo(s));
      q[2 * l + 1] = tf_lb_iq3_w4<TF_IQ3S_LUT_P0, TF_IQ3S_LUT_P1, TF_IQ3S_LUT_N0, TF_IQ3S_LUT_N1>(
          tf_iq3s_g16[i2], tf_lb_mask_hi(s));
    }
    const float dl = tf_h2f((uint16_t)tf_ld_u16(blk)) * (float)(1 + 2 * (int)sc);
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int s = tf_lb_dot32(q, xq + c * K + 32 * part, 0);
      acc[c] += dl * xd[c * (K / 32) + part] * (float)s;
    }
  }
};

// ---------------------------------------------------------------- Q1_0 (type 41)
// d f16 @0, qs[16] @2: bit e%8 of byte e/8 set -> +d, clear -> -d.  128 elements, 4 parts.
// sum (2b-1)*x = 2*sum b*x - sum x.
struct F_Q1_0 {
  static constexpr int TYPE = 41, QK = 128, BB = 18, PARTS = 4;
  template <int NC>
  TF_DEV static void dot(const uint8_t* __restrict__ blk, int part, const int8_t* __restrict__ xq,
                         const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                         float (&acc)[NC]) {
    const uint32_t bits = tf_ld_u32_a2(blk + 2 + 4 * part);
    uint32_t q[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = (((bits >> (4 * i)) & 15u) * 0x00204081u) & TF_LB_M1;
    const float d = tf_h2f((uint16_t)tf_ld_u16(blk));
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int* s16 = xs16 + c * (K / 16) + 2 * part;
      const int s = tf_lb_dot32(q, xq + c * K + 32 * part, 0);
      acc[c] += d * xd[c * (K / 32) + part] * (float)(2 * s - s16[0] - s16[1]);
    }
  }
};

// ---------------------------------------------------------------- Q2_0 (type 42)
// d f16 @0, qs[16] @2: element e = crumb e%4 of byte e/4 (consecutive); w = d*(c-1).
// 64 elements, 2 parts.  Byte -> word: nibbles to fields 0/16 (x 0x1001), crumbs to bytes (x 65).
struct F_Q2_0 {
  static constexpr int TYPE = 42, QK = 64, BB = 18, PARTS = 2;
  template <int NC>
  TF_DEV static void dot(const uint8_t* __restrict__ blk, int part, const int8_t* __restrict__ xq,
                         const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                         float (&acc)[NC]) {
    uint32_t a[2];
    tf_ld_words<2, 2>(blk + 2 + 8 * part, a);
    uint32_t q[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t b = (a[i >> 2] >> (8 * (i & 3))) & 0xFFu;
      const uint32_t t = (b * 0x1001u) & 0x000F000Fu;
      q[i] = (t * 65u) & TF_LB_M3;
    }
    const float d = tf_h2f((uint16_t)tf_ld_u16(blk));
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int* s16 = xs16 + c * (K / 16) + 2 * part;
      const int s = tf_lb_dot32(q, xq + c * K + 32 * part, -(s16[0] + s16[1]));
      acc[c] += d * xd[c * (K / 32) + part] * (float)s;
    }
  }
};

#define TF_LOWBIT_FORMATS(X) X(F_Q2_K, 10) X(F_Q3_K, 11) X(F_IQ2_XXS, 16) X(F_IQ2_XS, 17) \
  X(F_IQ2_S, 22) X(F_IQ3_XXS, 18) X(F_IQ3_S, 21) X(F_TQ1_0, 34) X(F_TQ2_0, 35) X(F_Q1_0, 41) \
  X(F_Q2_0, 42)
