// tightfit CUDA GEMV: block formats Q8_0 Q4_0 Q5_0 IQ4_NL IQ4_XS Q4_K Q5_K Q6_K (CONTRACT.md).
// Written from the GGUF block layouts (oracle: gguf-py gguf.quants; tightfit/quant/*.py).
// Every dot works on 32-bit words: nibbles/bit-planes extracted 4 at a time (SWAR), signed byte
// dot products with tf_dp4a, offsets and mins folded in through the activations' 16-sums.
#pragma once

#define TF_M4 0x0F0F0F0Fu

// x words of column c: 16 bytes at element offset e (e a multiple of 16)
#define TF_X16(c, e, w) tf_ld_x16(xq + (c) * K + (e), w)

// ------------------------------------------------------------------ Q8_0 (type 8)
// d f16 @0, 32 x int8 @2.  One lane per block (34 bytes, 2-byte aligned).
// load/compute split (Raw): the v3 kernel loads every item of a chunk first and then runs compute<1>
// column by column for all its rows, reusing each column's x words across the rows.
struct F_Q8_0 {
  static constexpr int TYPE = 8, QK = 32, BB = 34, PARTS = 1;
  struct Raw { uint32_t d, q[8]; };
  TF_DEV static void load(const uint8_t* __restrict__ blk, int part, Raw& r) {
    (void)part;
    r.d = tf_ld_u16(blk);
    tf_ld_words<2, 8>(blk + 2, r.q);
  }
  template <int NC>
  TF_DEV static void compute(const Raw& r, int part, const int8_t* __restrict__ xq,
                             const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                             float (&acc)[NC]) {
    (void)part; (void)xs16;
    const float d = tf_h2f((uint16_t)r.d);
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      uint32_t x0[4], x1[4];
      TF_X16(c, 0, x0); TF_X16(c, 16, x1);
      int s = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) s = tf_dp4a((int)r.q[i], (int)x0[i], s);
#pragma unroll
      for (int i = 0; i < 4; ++i) s = tf_dp4a((int)r.q[4 + i], (int)x1[i], s);
      acc[c] += d * xd[c * (K / 32)] * (float)s;
    }
  }
  template <int NC>
  TF_DEV static void dot(const uint8_t* __restrict__ blk, int part, const int8_t* __restrict__ xq,
                         const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                         float (&acc)[NC]) {
    Raw r;
    load(blk, part, r);
    compute<NC>(r, part, xq, xd, xs16, K, acc);
  }
};

// ------------------------------------------------------------------ Q4_0 (type 2)
// d f16 @0, qs[16] @2: byte j low nibble = element j, high nibble = element j+16; w = d*(q-8).
struct F_Q4_0 {
  static constexpr int TYPE = 2, QK = 32, BB = 18, PARTS = 1;
  template <int NC>
  TF_DEV static void dot(const uint8_t* __restrict__ blk, int part, const int8_t* __restrict__ xq,
                         const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                         float (&acc)[NC]) {
    (void)part;
    uint32_t w[4];
    float d = tf_h2f((uint16_t)tf_ld_u16(blk));
    tf_ld_words<2, 4>(blk + 2, w);
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) { lo[i] = w[i] & TF_M4; hi[i] = (w[i] >> 4) & TF_M4; }
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      uint32_t x0[4], x1[4];
      TF_X16(c, 0, x0); TF_X16(c, 16, x1);
      int s = -8 * (xs16[c * (K / 16)] + xs16[c * (K / 16) + 1]);
#pragma unroll
      for (int i = 0; i < 4; ++i) { s = tf_dp4a((int)lo[i], (int)x0[i], s); s = tf_dp4a((int)hi[i], (int)x1[i], s); }
      acc[c] += d * xd[c * (K / 32)] * (float)s;
    }
  }
};

// 4 bits (n & 15) -> bit 4 of the 4 bytes (byte k gets bit k): one multiply, no carries
TF_DEV uint32_t tf_spread4_b4(uint32_t n) { return ((n & 15u) * 0x02040810u) & 0x10101010u; }

// ------------------------------------------------------------------ Q5_0 (type 6)
// d f16 @0, qh u32 @2 (bit e = fifth bit of element e), qs[16] @6 (as Q4_0); w = d*(q-16).
struct F_Q5_0 {
  static constexpr int TYPE = 6, QK = 32, BB = 22, PARTS = 1;
  template <int NC>
  TF_DEV static void dot(const uint8_t* __restrict__ blk, int part, const int8_t* __restrict__ xq,
                         const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                         float (&acc)[NC]) {
    (void)part;
    uint32_t w[5];
    float d = tf_h2f((uint16_t)tf_ld_u16(blk));
    tf_ld_words<2, 5>(blk + 2, w);      // w[0] = qh, w[1..4] = qs
    uint32_t qh = w[0];
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lo[i] = (w[1 + i] & TF_M4) | tf_spread4_b4(qh >> (4 * i));
      hi[i] = ((w[1 + i] >> 4) & TF_M4) | tf_spread4_b4(qh >> (16 + 4 * i));
    }
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      uint32_t x0[4], x1[4];
      TF_X16(c, 0, x0); TF_X16(c, 16, x1);
      int s = -16 * (xs16[c * (K / 16)] + xs16[c * (K / 16) + 1]);
#pragma unroll
      for (int i = 0; i < 4; ++i) { s = tf_dp4a((int)lo[i], (int)x0[i], s); s = tf_dp4a((int)hi[i], (int)x1[i], s); }
      acc[c] += d * xd[c * (K / 32)] * (float)s;
    }
  }
};

// ------------------------------------------------------------------ IQ4 codebook lookup
// kvalues_iq4nl = {-127,-104,-83,-65,-49,-35,-22,-10, 1,13,25,38,53,69,89,113} as 4 words.
#define TF_IQ4_T0 0xBFAD9881u
#define TF_IQ4_T1 0xF6EADDCFu
#define TF_IQ4_T2 0x26190D01u
#define TF_IQ4_T3 0x71594535u

// 4 codes (selector nibbles in the low 16 bits of s7 = codes & 7, m4 = 4 where code >= 8)
TF_DEV uint32_t tf_iq4_lut4(uint32_t s7, uint32_t m4) {
  uint32_t a = tf_byte_perm(TF_IQ4_T0, TF_IQ4_T1, s7);
  uint32_t b = tf_byte_perm(TF_IQ4_T2, TF_IQ4_T3, s7);
  uint32_t m = tf_byte_perm(0u, 0xFFFFFFFFu, m4);
  return (a & ~m) | (b & m);
}

// One qs word (byte k: low nibble = element j+k, high nibble = element j+16+k) -> int8 codebook
// values of elements j..j+3 (lo) and j+16..j+19 (hi).  ~15 instructions per 8 weights.
TF_DEV void tf_iq4_word(uint32_t w, uint32_t& lo, uint32_t& hi) {
  uint32_t s7 = w & 0x77777777u;
  uint32_t m4 = (w >> 1) & 0x44444444u;
  uint32_t r0 = tf_iq4_lut4(s7, m4);              // elements j, j+16, j+1, j+17
  uint32_t r1 = tf_iq4_lut4(s7 >> 16, m4 >> 16);  // elements j+2, j+18, j+3, j+19
  lo = tf_byte_perm(r0, r1, 0x6420);
  hi = tf_byte_perm(r0, r1, 0x7531);
}

// Same result as tf_iq4_word, 13 instead of 15 operations: the choice between the two 8-entry
// halves is one more byte_perm on the two lookups (selector nibble k = k, +4 when code >= 8).
TF_DEV void tf_iq4_word2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t s7 = w & 0x77777777u;
  const uint32_t m = ((w >> 1) & 0x44444444u) | 0x32103210u;
  const uint32_t r0 = tf_byte_perm(tf_byte_perm(TF_IQ4_T0, TF_IQ4_T1, s7),
                                   tf_byte_perm(TF_IQ4_T2, TF_IQ4_T3, s7), m);
  const uint32_t s7h = s7 >> 16, mh = m >> 16;
  const uint32_t r1 = tf_byte_perm(tf_byte_perm(TF_IQ4_T0, TF_IQ4_T1, s7h),
                                   tf_byte_perm(TF_IQ4_T2, TF_IQ4_T3, s7h), mh);
  lo = tf_byte_perm(r0, r1, 0x6420);
  hi = tf_byte_perm(r0, r1, 0x7531);
}

// Single-column IQ4 dot of 32 codes (4 qs words, IQ4_NL byte order) with x (x0 = elements 0..15,
// x1 = 16..31): sum_e kvalues[code_e] * x_e, exact. ~13 instructions per 8 weights, 7 of them on
// the integer ALU pipe (tf_iq4_word2 + 2 dp4a: ~15, all but the dp4a on the ALU pipe).
//  - tf_prmt's sign mode does the half select: a selector nibble with bit 3 set returns 0x00 for a
//    table of non-negative bytes. Lookup A = |kvalues[0..7]| with the raw code (0 for codes >= 8),
//    lookup B = kvalues[8..15] with code ^ 8 (0 for codes < 8); dot = dot(B, x) - dot(A, x).
//    No select mask, no masking of the selector (only its low 16 bits are read).
//  - Each lookup reads 4 nibbles of a word = elements (k, k+16, k+1, k+17) (low half) or
//    (k+2, k+18, k+3, k+19) (high half): x is permuted to that order (2 PRMT per word) instead of
//    re-interleaving the 4 lookups (4 PRMT per word).
#define TF_IQ4_A0 0x4153687Fu   // |kvalues[0..7]| = 127 104 83 65 49 35 22 10
#define TF_IQ4_A1 0x0A162331u
TF_DEV int tf_iq4_dot1(const uint32_t (&w)[4], const uint32_t (&x0)[4], const uint32_t (&x1)[4],
                       int K) {
  // The tables are the PRMT's first source, which must be a register; ptxas re-creates a constant
  // register (MOV from a uniform register) before almost every use, ~4 instructions per 8 weights.
  // Made from K (> 0, so K >> 31 == 0), they are computed once per thread and stay in registers.
  const uint32_t z = (uint32_t)(K >> 31);
  const uint32_t a0 = TF_IQ4_A0 | z, b0 = TF_IQ4_T2 | z;
  int sa = 0, sb = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t xl = tf_prmt(x0[i], x1[i], 0x5140u), xh = tf_prmt(x0[i], x1[i], 0x7362u);
    const uint32_t wb = w[i] ^ 0x88888888u;
    sa = tf_dp4a((int)tf_prmt(a0, TF_IQ4_A1, w[i]), (int)xl, sa);
    sa = tf_dp4a((int)tf_prmt(a0, TF_IQ4_A1, tf_hi16(w[i])), (int)xh, sa);
    sb = tf_dp4a((int)tf_prmt(b0, TF_IQ4_T3, wb), (int)xl, sb);
    sb = tf_dp4a((int)tf_prmt(b0, TF_IQ4_T3, tf_hi16(wb)), (int)xh, sb);
  }
  return sb - sa;
}

// ------------------------------------------------------------------ IQ4_NL (type 20)
// d f16 @0, qs[16] @2 (Q4_0 nibble order); w = d * kvalues[q].
struct F_IQ4_NL {
  static constexpr int TYPE = 20, QK = 32, BB = 18, PARTS = 1;
  template <int NC>
  TF_DEV static void dot(const uint8_t* __restrict__ blk, int part, const int8_t* __restrict__ xq,
                         const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                         float (&acc)[NC]) {
    (void)part; (void)xs16;
    uint32_t w[4];
    float d = tf_h2f((uint16_t)tf_ld_u16(blk));
    tf_ld_words<2, 4>(blk + 2, w);
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) tf_iq4_word(w[i], lo[i], hi[i]);
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      uint32_t x0[4], x1[4];
      TF_X16(c, 0, x0); TF_X16(c, 16, x1);
      int s = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) { s = tf_dp4a((int)lo[i], (int)x0[i], s); s = tf_dp4a((int)hi[i], (int)x1[i], s); }
      acc[c] += d * xd[c * (K / 32)] * (float)s;
    }
  }
};

// ------------------------------------------------------------------ IQ4_XS (type 23)
// d f16 @0, scales_h u16 @2, scales_l[4] @4, qs[128] @8 (16 bytes per 32-sub-block, IQ4_NL order).
// Sub-block ib scale: ls = ((scales_l >> 4ib) & 15) | (((scales_h >> 2ib) & 3) << 4); dl = d*(ls-32).
// Part = sub-block (16 bytes of qs per lane).
// v2 (default): two-phase -- load() fetches the raw words (the v2 kernel issues the loads of all U
// items before any compute()); dot() = load + compute (what the v1 kernel and the host harness call).
struct F_IQ4_XS {
  static constexpr int TYPE = 23, QK = 256, BB = 136, PARTS = 8;
  struct Raw { uint32_t h[2], w[4]; };
  TF_DEV static void load(const uint8_t* __restrict__ blk, int part, Raw& r) {
    tf_ld_words<8, 2>(blk, r.h);        // d | scales_h << 16, scales_l
    tf_ld_words<8, 4>(blk + 8 + 16 * part, r.w);
  }
  template <int NC>
  TF_DEV static void compute(const Raw& r, int part, const int8_t* __restrict__ xq,
                             const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                             float (&acc)[NC]) {
    (void)xs16;
    const int ls = (int)(((r.h[1] >> (4 * part)) & 15u) | (((r.h[0] >> (16 + 2 * part)) & 3u) << 4));
    const float dl = tf_h2f((uint16_t)r.h[0]) * (float)(ls - 32);
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) tf_iq4_word2(r.w[i], lo[i], hi[i]);
    const int e = 32 * part;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      uint32_t x0[4], x1[4];
      TF_X16(c, e, x0); TF_X16(c, e + 16, x1);
      int s = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) { s = tf_dp4a((int)lo[i], (int)x0[i], s); s = tf_dp4a((int)hi[i], (int)x1[i], s); }
      acc[c] += dl * xd[c * (K / 32) + part] * (float)s;
    }
  }
  // One column (the N = 1 kernels tf_gemv2 / tf_gemv2h; see tf_iq4_dot1 for the decode).
  TF_DEV static void compute1(const Raw& r, int part, const int8_t* __restrict__ xq,
                              const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                              float& acc) {
    (void)xs16;
    uint32_t x0[4], x1[4];
    tf_ld_x16(xq + 32 * part, x0); tf_ld_x16(xq + 32 * part + 16, x1);
    // d * x-scale first (independent of the dot); the 6-bit scale (ls - 32) multiplies the integer
    // dot: |s| <= 32*127*127, |s * (ls - 32)| < 2^24, so the product and its float are exact.
    const float dxd = tf_h2f((uint16_t)r.h[0]) * tf_ldf(xd + part);
    const uint32_t l4 = (r.h[1] >> (4 * part)) & 15u, h2 = r.h[0] >> (12 + 2 * part);
    const int ls = (int)(l4 | (h2 & 0x30u)) - 32;
    acc += dxd * (float)(tf_iq4_dot1(r.w, x0, x1, K) * ls);
  }
  template <int NC>
  TF_DEV static void dot(const uint8_t* __restrict__ blk, int part, const int8_t* __restrict__ xq,
                         const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                         float (&acc)[NC]) {
    Raw r;
    load(blk, part, r);
    compute<NC>(r, part, xq, xd, xs16, K, acc);
  }
};

// ------------------------------------------------------------------ K4 scales (Q4_K / Q5_K)
// 12 bytes S[0..11] @4: j<4: sc = S[j]&63, m = S[j+4]&63; j>=4: sc = (S[j+4]&15) | (S[j-4]>>6)<<4,
// m = (S[j+4]>>4) | (S[j]>>6)<<4.  Returns sub-blocks 2c and 2c+1 (c = chunk of 64 elements).
TF_DEV void tf_k4_scales(const uint8_t* __restrict__ blk, int c, float& dsc0, float& dsc1,
                         float& dm0, float& dm1) {
  uint32_t h[4];
  tf_ld_words<16, 4>(blk, h);         // d|dmin, S0..3, S4..7, S8..11
  const uint32_t S0 = h[1], S1 = h[2], S2 = h[3];
  uint32_t scw, mw;
  if (c < 2) {
    scw = S0 & 0x3F3F3F3Fu;
    mw = S1 & 0x3F3F3F3Fu;
  } else {
    scw = (S2 & TF_M4) | ((S0 >> 2) & 0x30303030u);
    mw = ((S2 >> 4) & TF_M4) | ((S1 >> 2) & 0x30303030u);
  }
  const int sh = 16 * (c & 1);
  const float d = tf_h2f((uint16_t)h[0]), dmin = tf_h2f((uint16_t)(h[0] >> 16));
  dsc0 = d * (float)((scw >> sh) & 0xFFu);
  dsc1 = d * (float)((scw >> (sh + 8)) & 0xFFu);
  dm0 = dmin * (float)((mw >> sh) & 0xFFu);
  dm1 = dmin * (float)((mw >> (sh + 8)) & 0xFFu);
}

// Shared tail of Q4_K / Q5_K: lo codes = elements 64c+16h+[0..15] (sub-block 2c),
// hi codes = elements 64c+32+16h+[0..15] (sub-block 2c+1).
template <int NC>
TF_DEV void tf_k4_tail(const uint32_t (&lo)[4], const uint32_t (&hi)[4], int c, int h,
                       float dsc0, float dsc1, float dm0, float dm1,
                       const int8_t* __restrict__ xq, const float* __restrict__ xd,
                       const int* __restrict__ xs16, int K, float (&acc)[NC]) {
  const int e0 = 64 * c + 16 * h;
#pragma unroll
  for (int cc = 0; cc < NC; ++cc) {
    uint32_t x0[4], x1[4];
    TF_X16(cc, e0, x0); TF_X16(cc, e0 + 32, x1);
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) { s0 = tf_dp4a((int)lo[i], (int)x0[i], s0); s1 = tf_dp4a((int)hi[i], (int)x1[i], s1); }
    const int* s16 = xs16 + cc * (K / 16) + 4 * c + h;
    const float* xdc = xd + cc * (K / 32) + 2 * c;
    acc[cc] += xdc[0] * (dsc0 * (float)s0 - dm0 * (float)s16[0]) +
               xdc[1] * (dsc1 * (float)s1 - dm1 * (float)s16[2]);
  }
}

// ------------------------------------------------------------------ Q4_K (type 12)
// d f16 @0, dmin f16 @2, scales[12] @4, qs[128] @16: chunk c (32 bytes) = sub-block 2c in the low
// nibbles, 2c+1 in the high nibbles; w = d*sc*q - dmin*m.  Part p: c = p/2, h = p%2 -> qs bytes
// 16p..16p+15 (16-byte aligned load).
// load/compute split (Raw, see F_Q8_0); compute decodes the scales as F_Q5_K does.
TF_DEV void tf_k4_scales_w(const uint32_t (&h)[4], int c, float& dsc0, float& dsc1, float& dm0,
                           float& dm1) {
  const uint32_t S0 = h[1], S1 = h[2], S2 = h[3];
  const uint32_t scw = c < 2 ? (S0 & 0x3F3F3F3Fu) : ((S2 & TF_M4) | ((S0 >> 2) & 0x30303030u));
  const uint32_t mw = c < 2 ? (S1 & 0x3F3F3F3Fu) : (((S2 >> 4) & TF_M4) | ((S1 >> 2) & 0x30303030u));
  const int sh = 16 * (c & 1);
  const float d = tf_h2f((uint16_t)h[0]), dmin = tf_h2f((uint16_t)(h[0] >> 16));
  dsc0 = d * (float)((scw >> sh) & 0xFFu); dsc1 = d * (float)((scw >> (sh + 8)) & 0xFFu);
  dm0 = dmin * (float)((mw >> sh) & 0xFFu); dm1 = dmin * (float)((mw >> (sh + 8)) & 0xFFu);
}
struct F_Q4_K {
  static constexpr int TYPE = 12, QK = 256, BB = 144, PARTS = 8;
  struct Raw { uint32_t h[4], w[4]; };
  TF_DEV static void load(const uint8_t* __restrict__ blk, int part, Raw& r) {
    tf_ld_words<16, 4>(blk + 16 + 16 * part, r.w);
    tf_ld_words<16, 4>(blk, r.h);
  }
  template <int NC>
  TF_DEV static void compute(const Raw& r, int part, const int8_t* __restrict__ xq,
                             const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                             float (&acc)[NC]) {
    const int c = part >> 1, h = part & 1;
    float dsc0, dsc1, dm0, dm1;
    tf_k4_scales_w(r.h, c, dsc0, dsc1, dm0, dm1);
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) { lo[i] = r.w[i] & TF_M4; hi[i] = (r.w[i] >> 4) & TF_M4; }
    tf_k4_tail<NC>(lo, hi, c, h, dsc0, dsc1, dm0, dm1, xq, xd, xs16, K, acc);
  }
  template <int NC>
  TF_DEV static void dot(const uint8_t* __restrict__ blk, int part, const int8_t* __restrict__ xq,
                         const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                         float (&acc)[NC]) {
    Raw r;
    load(blk, part, r);
    compute<NC>(r, part, xq, xd, xs16, K, acc);
  }
};

// ------------------------------------------------------------------ Q5_K (type 13)
// d @0, dmin @2, scales[12] @4, qh[32] @16 (bit j of qh[l] = fifth bit of element 32j+l),
// qs[128] @48 (as Q4_K).  Part p: c = p/2, h = p%2 -> qs bytes 16p.., qh bytes 16h..16h+15.
// v2 (default): two-phase (see F_IQ4_XS); the 16-byte header (d, dmin, scales) is loaded with the
// bulk words, the scale decode happens in compute().
struct F_Q5_K {
  static constexpr int TYPE = 13, QK = 256, BB = 176, PARTS = 8;
  struct Raw { uint32_t h[4], w[4], qh[4]; };
  TF_DEV static void load(const uint8_t* __restrict__ blk, int part, Raw& r) {
    tf_ld_words<16, 4>(blk + 48 + 16 * part, r.w);
    tf_ld_words<16, 4>(blk + 16 + 16 * (part & 1), r.qh);
    tf_ld_words<16, 4>(blk, r.h);
  }
  template <int NC>
  TF_DEV static void compute(const Raw& r, int part, const int8_t* __restrict__ xq,
                             const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                             float (&acc)[NC]) {
    const int c = part >> 1, h = part & 1;
    const uint32_t S0 = r.h[1], S1 = r.h[2], S2 = r.h[3];
    const uint32_t scw = c < 2 ? (S0 & 0x3F3F3F3Fu) : ((S2 & TF_M4) | ((S0 >> 2) & 0x30303030u));
    const uint32_t mw = c < 2 ? (S1 & 0x3F3F3F3Fu) : (((S2 >> 4) & TF_M4) | ((S1 >> 2) & 0x30303030u));
    const int sh = 16 * (c & 1);
    const float d = tf_h2f((uint16_t)r.h[0]), dmin = tf_h2f((uint16_t)(r.h[0] >> 16));
    const float dsc0 = d * (float)((scw >> sh) & 0xFFu), dsc1 = d * (float)((scw >> (sh + 8)) & 0xFFu);
    const float dm0 = dmin * (float)((mw >> sh) & 0xFFu), dm1 = dmin * (float)((mw >> (sh + 8)) & 0xFFu);
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t b = r.qh[i] >> (2 * c);
      lo[i] = (r.w[i] & TF_M4) | ((b << 4) & 0x10101010u);
      hi[i] = ((r.w[i] >> 4) & TF_M4) | ((b << 3) & 0x10101010u);
    }
    tf_k4_tail<NC>(lo, hi, c, h, dsc0, dsc1, dm0, dm1, xq, xd, xs16, K, acc);
  }
  // One column (kern v5: tf_gemv5 / tf_gemv4 at N = 1). Part p = (c, h) as in compute:
  //  - 5th bits: one rotate per qh word puts bit 2c of every byte at bit 4 and bit 2c+1 at bit 5;
  //    lo codes (sub-block 2c) = nibble | bit 4, hi codes (2c+1) taken as 2*code = (w >> 3) & 0x1E
  //    | bit 5 (<= 62, still a signed byte), so both use the same rotate and no per-bit shifts.
  //  - scales: the 6-bit sc / m go into the integer dots (sc0*s0, sc1*(2 s1), m*S32: all < 2^24,
  //    exact in fp32), selected with per-lane PRMT selectors and masks (no select on the data).
  //  - mins: part p takes the whole min term of sub-block p (= 2c + h, one of its two sub-blocks):
  //    dmin * m_p * xd_p * (s16[2p] + s16[2p+1]); one m per item instead of two.
  //  - xd[2c], xd[2c+1] and s16[2p], s16[2p+1] as 8-byte loads (compute1 callers keep xd / xs16
  //    8-byte aligned).
  TF_DEV static void compute1(const Raw& r, int part, const int8_t* __restrict__ xq,
                              const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                              float& acc) {
    (void)K;
    const int c = part >> 1, h = part & 1;
    uint32_t x0[4], x1[4];
    tf_ld_x16(xq + 64 * c + 16 * h, x0); tf_ld_x16(xq + 64 * c + 16 * h + 32, x1);
    float xd0, xd1;
    tf_ldf2(xd + 2 * c, xd0, xd1);
    int sa, sb;
    tf_ldi2(xs16 + 2 * part, sa, sb);
    const uint32_t rot = (uint32_t)(28 + 2 * c) & 31u;     // funnel right by rot = rotate left 4-2c
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t q5 = tf_funnel_r(r.qh[i], r.qh[i], rot);
      const uint32_t lo = (r.w[i] & TF_M4) | (q5 & 0x10101010u);
      const uint32_t hi2 = ((r.w[i] >> 3) & 0x1E1E1E1Eu) | (q5 & 0x20202020u);
      s0 = tf_dp4a((int)lo, (int)x0[i], s0);
      s1 = tf_dp4a((int)hi2, (int)x1[i], s1);
    }
    // Scales, with per-lane constants only (part is fixed per lane: hoisted out of the kernel's
    // loop). One PRMT per value puts the low bits' byte in byte 0 and the byte holding the top two
    // bits in byte 3, whose >> 26 leaves exactly those bits at 4..5 and zeros above; cm (0x3F for
    // sub-blocks < 4, 0x0F above) picks the low bits from byte 0, the rest from the >> 26.
    //   sc_j, j < 4: S0.b[j] & 63;  j >= 4: (S2.b[j-4] & 15) | (S0.b[j-4] >> 6) << 4
    //   m_j,  j < 4: S1.b[j] & 63;  j >= 4: (S2.b[j-4] >> 4) | (S1.b[j-4] >> 6) << 4
    const bool hq = c >= 2;                                // sub-blocks 2c, 2c+1 and p all >= 4
    const uint32_t j = 2u * (uint32_t)(c & 1);             // byte of sub-block 2c within its word
    const uint32_t sel0 = (hq ? 4u + j : j) | j << 12;     // {A.b[j], ., ., S0.b[j]}, A = S0 or S2
    const uint32_t sel1 = sel0 + 0x1001u;                  // the same for byte j + 1
    const uint32_t k = (uint32_t)part & 3u;                // byte of sub-block p
    const uint32_t selm = (hq ? 4u + k : k) | k << 12;     // {S1.b[k] or S2.b[k], ., ., S1.b[k]}
    const uint32_t cm = hq ? 0x0Fu : 0x3Fu, msh = hq ? 4u : 0u;
    const uint32_t S0 = r.h[1], S1 = r.h[2], S2 = r.h[3];
    const uint32_t v0 = tf_prmt(S0, S2, sel0), v1 = tf_prmt(S0, S2, sel1), vm = tf_prmt(S1, S2, selm);
    const int sc0 = (int)((v0 & cm) | ((v0 >> 26) & ~cm));
    const int sc1 = (int)((v1 & cm) | ((v1 >> 26) & ~cm));
    const int m = (int)((tf_funnel_r(vm, vm, msh) & cm) | ((vm >> 26) & ~cm));
    const float d = tf_h2f((uint16_t)r.h[0]), dmin = tf_h2f((uint16_t)(r.h[0] >> 16));
    // s1 is twice the hi dot: halve the (even) product in integers
    const float f = xd0 * (float)(sc0 * s0) + xd1 * (float)((sc1 * s1) >> 1);
    acc += d * f;
    acc -= (dmin * (h ? xd1 : xd0)) * (float)(m * (sa + sb));
  }
  template <int NC>
  TF_DEV static void dot(const uint8_t* __restrict__ blk, int part, const int8_t* __restrict__ xq,
                         const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                         float (&acc)[NC]) {
    Raw r;
    load(blk, part, r);
    compute<NC>(r, part, xq, xd, xs16, K, acc);
  }
};

// ------------------------------------------------------------------ Q6_K (type 14)
// ql[128] @0, qh[64] @128, int8 scales[16] @192, d f16 @208 (block 2-byte aligned).
// Element 128n + 32k + l (n half, k 0..3, l 0..31): low 4 bits = ql[64n + 32(k&1) + l] nibble k>>1,
// high 2 bits = qh[32n + l] bits 2k..2k+1, scale = scales[8n + 2k + l/16]; w = d*sc*(q-32).
// Part p: n = p/4, kk = (p/2)&1, lh = p&1 -> ql bytes 16p..16p+15 (k = kk low nibbles, k = kk+2 high
// nibbles), qh bytes 128+32n+16lh.., two 16-groups: elements 128n+32kk+16lh+[0..15] and +64.
// load/compute split (Raw, see F_Q8_0): the two scale bytes and d are loaded in load().
struct F_Q6_K {
  static constexpr int TYPE = 14, QK = 256, BB = 210, PARTS = 8;
  struct Raw { uint32_t ql[4], qh[4], sa, sb, d; };
  TF_DEV static void load(const uint8_t* __restrict__ blk, int part, Raw& r) {
    const int n = part >> 2, kk = (part >> 1) & 1, lh = part & 1;
    const int gA = 8 * n + 2 * kk + lh;
    tf_ld_words<2, 4>(blk + 16 * part, r.ql);
    tf_ld_words<2, 4>(blk + 128 + 32 * n + 16 * lh, r.qh);
    r.d = tf_ld_u16(blk + 208);
    r.sa = blk[192 + gA];
    r.sb = blk[192 + gA + 4];
  }
  template <int NC>
  TF_DEV static void compute(const Raw& r, int part, const int8_t* __restrict__ xq,
                             const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                             float (&acc)[NC]) {
    const int n = part >> 2, kk = (part >> 1) & 1, lh = part & 1;
    const int gA = 8 * n + 2 * kk + lh;
    const float d = tf_h2f((uint16_t)r.d);
    const float da = d * (float)(int8_t)(uint8_t)r.sa;
    const float db = d * (float)(int8_t)(uint8_t)r.sb;
    uint32_t qa[4], qb[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t hs = r.qh[i] >> (2 * kk);
      qa[i] = (r.ql[i] & TF_M4) | ((hs << 4) & 0x30303030u);
      qb[i] = ((r.ql[i] >> 4) & TF_M4) | (hs & 0x30303030u);
    }
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      uint32_t x0[4], x1[4];
      TF_X16(c, 16 * gA, x0); TF_X16(c, 16 * gA + 64, x1);
      const int* s16 = xs16 + c * (K / 16) + gA;
      int sa = -32 * s16[0], sb = -32 * s16[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) { sa = tf_dp4a((int)qa[i], (int)x0[i], sa); sb = tf_dp4a((int)qb[i], (int)x1[i], sb); }
      const float* xdc = xd + c * (K / 32) + (gA >> 1);
      acc[c] += da * xdc[0] * (float)sa + db * xdc[2] * (float)sb;
    }
  }
  // Single-column path (kern v5: tf_gemv5 at N = 1). load1 = load with the 2-byte aligned words
  // read through tf_ld_words_a2 (global loads instead of generic ones) and the scales loaded
  // sign-extended; compute1 multiplies the int8 sub-scales into the integer dots (|sc * dot| <=
  // 128 * 16 * 32 * 127 < 2^24: exact in fp32) and converts two sums per item instead of scales.
  TF_DEV static void load1(const uint8_t* __restrict__ blk, int part, Raw& r) {
    const int n = part >> 2, kk = (part >> 1) & 1, lh = part & 1;
    const int gA = 8 * n + 2 * kk + lh;
    tf_ld_words_a2<4>(blk + 16 * part, r.ql);
    tf_ld_words_a2<4>(blk + 128 + 32 * n + 16 * lh, r.qh);
    r.d = tf_ld_u16(blk + 208);
    r.sa = (uint32_t)(int)(int8_t)blk[192 + gA];
    r.sb = (uint32_t)(int)(int8_t)blk[192 + gA + 4];
  }
  TF_DEV static void compute1(const Raw& r, int part, const int8_t* __restrict__ xq,
                              const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                              float& acc) {
    (void)K;
    const int n = part >> 2, kk = (part >> 1) & 1, lh = part & 1;
    const int gA = 8 * n + 2 * kk + lh;
    uint32_t x0[4], x1[4];
    tf_ld_x16(xq + 16 * gA, x0); tf_ld_x16(xq + 16 * gA + 64, x1);
    int sa = -32 * tf_ldi(xs16 + gA), sb = -32 * tf_ldi(xs16 + gA + 4);
    const uint32_t sh = 2u * (uint32_t)kk;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t hs = r.qh[i] >> sh;
      const uint32_t qa = (r.ql[i] & TF_M4) | ((hs << 4) & 0x30303030u);
      const uint32_t qb = ((r.ql[i] >> 4) & TF_M4) | (hs & 0x30303030u);
      sa = tf_dp4a((int)qa, (int)x0[i], sa);
      sb = tf_dp4a((int)qb, (int)x1[i], sb);
    }
    const float* xdc = xd + (gA >> 1);
    const float f = tf_ldf(xdc) * (float)((int)r.sa * sa) + tf_ldf(xdc + 2) * (float)((int)r.sb * sb);
    acc += tf_h2f((uint16_t)r.d) * f;
  }
  template <int NC>
  TF_DEV static void dot(const uint8_t* __restrict__ blk, int part, const int8_t* __restrict__ xq,
                         const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                         float (&acc)[NC]) {
    Raw r;
    load(blk, part, r);
    compute<NC>(r, part, xq, xd, xs16, K, acc);
  }
};

#define TF_MAIN_FORMATS(X) X(F_Q8_0, 8) X(F_Q4_0, 2) X(F_Q5_0, 6) X(F_IQ4_NL, 20) \
  X(F_IQ4_XS, 23) X(F_Q4_K, 12) X(F_Q5_K, 13) X(F_Q6_K, 14)
