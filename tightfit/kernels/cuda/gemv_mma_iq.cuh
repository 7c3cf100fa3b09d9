// tightfit skinny GEMM on int8 tensor cores: the grid formats (IQ2_XS, IQ3_XXS, IQ3_S, IQ2_S).
// Include after gemv_mma.cuh (format interface, tf_mma_block) and gemv_fmt_lowbit.cuh (the PRMT
// grid decoders tf_lb_*, written for the dp4a kernels; the tables of cuda/tables.py).
//
// Why (session 24): the verify block's five-column products of these formats ran on the dp4a
// kernels at 1.9x their one-column time (the 2-3-bit formats cost +0.42 ms per M = 5 block,
// bench/RESULTS.md session 23), because dp4a repeats the activation loads and dot products per
// column. Here the grid decode is the dp4a kernels' own (one table gather per 4 or 8 weights,
// signs from bits) and the columns go through the tensor core.
//
// Lane t of a row covers the 8-element run t of every 32-element group j (elements 8t..8t+7):
// slots 4t..4t+3 take elements 8t..8t+3 and slots 16+4t.. take 8t+4..8t+7, so x is one 8-byte
// load at element 32j + 8t (as Q4_K). The IQ2 formats scale each 16-element half of a group apart
// (SPLIT): lanes 0-1 hold the first half, lanes 2-3 the second; tf_mma_group (gemv_mma.cuh) runs
// one mma per half with the other half's B slots zeroed, and scale() returns (ws of half 0, ws of
// half 1).
// Blocks are only 2-byte aligned, so raw loads are 8- and 16-bit; tf_mma_pipe stages them through
// shared memory (gemv_mma.PIPE_TYPES).
#pragma once

// x of lane t's run of group j (elements 8t..8t+7): one 8-byte load, in every grid format
struct tf_mma_iq_x {
  TF_DEV static void xfrag(const int8_t* __restrict__ xb, int t, int j, uint32_t (&b)[2]) {
    tf_mma_ldx8(xb + 32 * j + 8 * t, b[0], b[1]);
  }
};

// The IQ2 formats' two scales of group j: byte j of the scales words sc (low nibble: elements
// 0..15, high: 16..31), each d / 8 * (2 * nibble + 1), exact (no I2F: the odd integers as fp32 bits)
TF_DEV void tf_mma_iq2_scales(uint32_t d, const uint32_t (&sc)[2], int j, float& ws, float& wm) {
  const uint32_t sb = (sc[j >> 2] >> (8 * (j & 3))) & 0xFFu;
  const float d8 = tf_h2f((uint16_t)d) * 0.125f;
  ws = d8 * tf_u23_f32(2 * (sb & 15u) + 1, 0);
  wm = d8 * tf_u23_f32(2 * (sb >> 4) + 1, 0);
}

// IQ3 run of 8 from two grid code words and a sign byte s (bit i = element i)
template <uint32_t P0, uint32_t P1, uint32_t N0, uint32_t N1>
TF_DEV void tf_mma_iq3_w8(uint32_t e0, uint32_t e1, uint32_t s, uint32_t (&a)[2]) {
  a[0] = tf_lb_iq3_w4<P0, P1, N0, N1>(e0, tf_lb_mask_lo(s));
  a[1] = tf_lb_iq3_w4<P0, P1, N0, N1>(e1, tf_lb_mask_hi(s));
}

// ------------------------------------------------------------------ IQ2_XS (type 17)
// d f16 @0, qs u16[32] @2 (run e = 4j + l: 9-bit grid index | 7-bit ksigns index << 9), scales[8]
// @66 (byte j: low nibble = elements 0..15 of group j, high nibble = 16..31); w = d*(2*nib+1)/8 *
// grid * sign. Lane t: the u16 of run 4j + t for every j.
struct M_IQ2_XS : tf_mma_iq_x {
  static constexpr int TYPE = 17, QK = 256, BB = 74, KS = 32, NG = 8, U = 2;
  static constexpr bool MINS = false, SPLIT = true;
  struct Raw { uint32_t d, q[8], sc[2]; };
  TF_DEV static void load(const uint8_t* __restrict__ blk, int t, Raw& r) {
    r.d = tf_ld_u16(blk);
#pragma unroll
    for (int j = 0; j < 8; ++j) r.q[j] = tf_ld_u16(blk + 2 + 8 * j + 2 * t);
    r.sc[0] = tf_ld_u32_a2(blk + 66);
    r.sc[1] = tf_ld_u32_a2(blk + 70);
  }
  TF_DEV static void afrag(const Raw& r, int t, int j, uint32_t (&a)[2]) {
    (void)t;
    const uint32_t w = r.q[j];
    tf_lb_iq2_w8(tf_iq2xs_g16[w & 511u], tf_lb_ksgn_nib(w, 9), a[0], a[1]);
  }
  TF_DEV static void scale(const Raw& r, int j, float& ws, float& wm) {
    tf_mma_iq2_scales(r.d, r.sc, j, ws, wm);
  }
};

// ------------------------------------------------------------------ IQ3_XXS (type 18)
// d f16 @0, qs[64] @2 (group j: bytes 2+8j..; bytes 2l, 2l+1 = grid indices of elements 8l..8l+3,
// 8l+4..8l+7), aux u32 @66+4j (7-bit ksigns index of run l at bits 7l, scale s at bits 28..31);
// w = d*(2s+1)/4 * grid * sign; sign 7 of a run = parity of its 7 index bits.
struct M_IQ3_XXS : tf_mma_iq_x {
  static constexpr int TYPE = 18, QK = 256, BB = 98, KS = 32, NG = 8, U = 2;
  static constexpr bool MINS = false, SPLIT = false;
  struct Raw { uint32_t d, q[8], aux[8]; };
  TF_DEV static void load(const uint8_t* __restrict__ blk, int t, Raw& r) {
    r.d = tf_ld_u16(blk);
#pragma unroll
    for (int j = 0; j < 8; ++j) r.q[j] = tf_ld_u16(blk + 2 + 8 * j + 2 * t);
#pragma unroll
    for (int j = 0; j < 8; ++j) r.aux[j] = tf_ld_u32_a2(blk + 66 + 4 * j);
  }
  TF_DEV static void afrag(const Raw& r, int t, int j, uint32_t (&a)[2]) {
    const uint32_t k = (r.aux[j] >> (7 * t)) & 0x7Fu;
    const uint32_t s = k | ((tf_lb_popc(k) & 1u) << 7);
    tf_mma_iq3_w8<TF_IQ3XXS_LUT_P0, TF_IQ3XXS_LUT_P1, TF_IQ3XXS_LUT_N0, TF_IQ3XXS_LUT_N1>(
        tf_iq3xxs_g16[r.q[j] & 0xFFu], tf_iq3xxs_g16[r.q[j] >> 8], s, a);
  }
  TF_DEV static void scale(const Raw& r, int j, float& ws, float& wm) {
    ws = tf_h2f((uint16_t)r.d) * 0.25f * tf_u23_f32(2 * (r.aux[j] >> 28) + 1, 0);
    wm = 0.f;
  }
};

// ------------------------------------------------------------------ IQ3_S (type 21)
// d f16 @0, qs[64] @2 (low 8 index bits, as IQ3_XXS), qh[8] @66 (byte j: bit k = 9th bit of index
// k of group j), signs[32] @74 (byte 4j + l: run l of group j), scales[4] @106 (nibble j);
// w = d*(1+2*sc) * grid * sign.
struct M_IQ3_S : tf_mma_iq_x {
  static constexpr int TYPE = 21, QK = 256, BB = 110, KS = 32, NG = 8, U = 2;
  static constexpr bool MINS = false, SPLIT = false;
  struct Raw { uint32_t d, q[8], qh[2], sg[8], sc; };
  TF_DEV static void load(const uint8_t* __restrict__ blk, int t, Raw& r) {
    r.d = tf_ld_u16(blk);
#pragma unroll
    for (int j = 0; j < 8; ++j) r.q[j] = tf_ld_u16(blk + 2 + 8 * j + 2 * t);
    r.qh[0] = tf_ld_u32_a2(blk + 66);
    r.qh[1] = tf_ld_u32_a2(blk + 70);
#pragma unroll
    for (int j = 0; j < 8; ++j) r.sg[j] = blk[74 + 4 * j + t];
    r.sc = tf_ld_u32_a2(blk + 106);
  }
  TF_DEV static void afrag(const Raw& r, int t, int j, uint32_t (&a)[2]) {
    const uint32_t hb = r.qh[j >> 2] >> (8 * (j & 3) + 2 * t);      // bits: index 2t, 2t+1
    const uint32_t i0 = (r.q[j] & 0xFFu) | ((hb << 8) & 0x100u);
    const uint32_t i1 = (r.q[j] >> 8) | ((hb << 7) & 0x100u);
    tf_mma_iq3_w8<TF_IQ3S_LUT_P0, TF_IQ3S_LUT_P1, TF_IQ3S_LUT_N0, TF_IQ3S_LUT_N1>(
        tf_iq3s_g16[i0], tf_iq3s_g16[i1], r.sg[j], a);
  }
  TF_DEV static void scale(const Raw& r, int j, float& ws, float& wm) {
    ws = tf_h2f((uint16_t)r.d) * tf_u23_f32(1 + 2 * ((r.sc >> (4 * j)) & 15u), 0);
    wm = 0.f;
  }
};

// ------------------------------------------------------------------ IQ2_S (type 22)
// d f16 @0, qs[32] @2 (low 8 index bits of run e = 4j + l), signs[32] @34 (explicit sign byte of
// run e), qh[8] @66 (byte j: bits 2l..2l+1 = index bits 8-9 of run 4j + l), scales[8] @74 (as
// IQ2_XS). Lane t: the bytes of run 4j + t for every j.
struct M_IQ2_S : tf_mma_iq_x {
  static constexpr int TYPE = 22, QK = 256, BB = 82, KS = 32, NG = 8, U = 2;
  static constexpr bool MINS = false, SPLIT = true;
  struct Raw { uint32_t d, q[8], sg[8], qh[2], sc[2]; };
  TF_DEV static void load(const uint8_t* __restrict__ blk, int t, Raw& r) {
    r.d = tf_ld_u16(blk);
#pragma unroll
    for (int j = 0; j < 8; ++j) r.q[j] = blk[2 + 4 * j + t];
#pragma unroll
    for (int j = 0; j < 8; ++j) r.sg[j] = blk[34 + 4 * j + t];
    r.qh[0] = tf_ld_u32_a2(blk + 66);
    r.qh[1] = tf_ld_u32_a2(blk + 70);
    r.sc[0] = tf_ld_u32_a2(blk + 74);
    r.sc[1] = tf_ld_u32_a2(blk + 78);
  }
  TF_DEV static void afrag(const Raw& r, int t, int j, uint32_t (&a)[2]) {
    const uint32_t hi = (r.qh[j >> 2] >> (8 * (j & 3) + 2 * t)) & 3u;
    tf_lb_iq2_w8(tf_iq2s_g16[r.q[j] | (hi << 8)], tf_lb_sgn_nib(r.sg[j]), a[0], a[1]);
  }
  TF_DEV static void scale(const Raw& r, int j, float& ws, float& wm) {
    tf_mma_iq2_scales(r.d, r.sc, j, ws, wm);
  }
};
