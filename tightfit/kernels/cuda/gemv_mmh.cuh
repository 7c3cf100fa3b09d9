// tightfit skinny GEMM on bf16 tensor cores with a shared-memory byte table ("mmh" path):
// y[c, r] = sum_k x[c, k] * W[r, k] for N = 1..8 columns, W = IQ4_XS raw GGUF blocks, x = fp32
// [N, K] as the model holds it (no activation quantization). Include after gemv_common.cuh and
// gemv_mma.cuh (it reuses the stream-K split and the deterministic fixup, tf_mma_finish).
//
// Why (bench/NOTES.md, session 17): the int8 tensor-core GEMV (tf_mma_rt) spends ~61 instructions
// per 512 weights, 36 of them on the half-rate ALU pipe: the IQ4_XS decode (6 PRMT / LOP3 per 8
// codes) and an I2F-free but still per-group int -> fp32 epilogue with the activation's scale.
// Here one PRMT per BYTE (two codes) forms a shared-memory address, and one LDS returns both codes
// already as a bf16x2 mma operand: the table has 256 rows (one per byte value) of 256 bytes, lane l
// reading word l of a row, so the 32 lanes of a warp always hit 32 different banks. x is converted
// to bf16 pairs in registers (one cvt per two elements, shared by every row tile of the warp), and
// a group's two m16n8k16 products accumulate in fp32 before its scale is applied once per row.
// bf16 holds every kvalue (|v| <= 127) exactly and x with 8 significant bits, ~ the int8 path's
// per-32 quantization, with fp32's range (no overflow on large activations).
// Measured (H200): ~42 instructions per 512 weights in the step loop, but only 8-15 % faster than
// tf_mma_rt at N = 5 on the 27B's wide IQ4_XS shapes, and 1.5x the dp4a kernel at N = 1: Nsight
// Compute has L1 66-80 % busy (each 4-byte weight load touches 8 rows' lines; the table lookups
// are as many shared-memory wavefronts again) and 34 % of the stalls on the first use of a block's
// weight words.
//
// Fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k16" .bf16), g = lane >> 2, t = lane & 3:
//   A: a0 = row g, k slots 2t, 2t+1; a1 = row g+8, same; a2 = row g, slots 2t+8, 2t+9; a3 = row g+8
//   B: b0 = column g, slots 2t, 2t+1; b1 = column g, slots 2t+8, 2t+9  (low half = lower slot)
//   C/D: d0, d1 = row g, columns 2t, 2t+1; d2, d3 = row g+8, columns 2t, 2t+1
// IQ4_XS group j (32 codes): qs bytes 16j..16j+15, byte i = codes of elements i (low nibble) and
// i + 16 (high nibble). Lane t keeps the word of bytes 16j + 4t .. 16j + 4t + 3; its byte m (0..3)
// looks up the pair (element 4t+m, element 4t+m+16). Product 1 of the group takes bytes 0 (slots
// 2t, 2t+1) and 1 (slots 2t+8, 2t+9), product 2 bytes 2 and 3, and B holds x of the same elements
// (x[4t+m], x[4t+m+16]): a permutation of the group's 32 positions, applied to both operands, so
// each product is a partial dot of group j alone and the group's scale applies to their sum.
#pragma once

#define TF_MMH_THREADS 256            // 8 warps: tf_mma_finish recomputes warp ids with TF_MMA_WARPS
#define TF_MMH_LUT_BYTES 65536        // 256 rows x 256 B (words 32..63 of a row unused)
#define TF_MMH_MINB 2                 // resident CTAs per SM (2 x 64 KB of table: 128 KB of 228)

// kvalues_iq4nl[i] as the fp32 it is (an exact small integer)
TF_DEV float tf_mmh_kv(uint32_t i) {
  const uint32_t w = i < 4 ? TF_MMA_IQ4_T0 : i < 8 ? TF_MMA_IQ4_T1 : i < 12 ? TF_MMA_IQ4_T2
                                                                          : TF_MMA_IQ4_T3;
  return (float)(int)(int8_t)(uint8_t)(w >> (8 * (i & 3u)));
}

// bf16 bits of an fp32 that bf16 represents exactly (truncation = rounding here)
TF_DEV uint32_t tf_mmh_bf16_exact(float f) {
#if TF_DEVICE
  return __float_as_uint(f) >> 16;
#else
  uint32_t u; memcpy(&u, &f, 4); return u >> 16;
#endif
}

// Table word for byte value e: low half = kvalue(e & 15), high half = kvalue(e >> 4).
TF_DEV uint32_t tf_mmh_iq4_entry(uint32_t e) {
  const float lo = tf_mmh_kv(e & 15u), hi = tf_mmh_kv(e >> 4);
  return tf_mmh_bf16_exact(lo) | (tf_mmh_bf16_exact(hi) << 16);
}

// Byte offset in the table of byte m of w for lane l (l4 = 4 * l): row w.byte[m], word l. One
// PRMT: result bytes = (l4, w.byte m, 0, 0) (selector nibbles 4, m, 5, 5; l4 < 128, so l4's byte
// 1 is zero).
TF_DEV uint32_t tf_mmh_addr(uint32_t w, uint32_t l4, int m) {
  return tf_prmt(w, l4, 0x5504u | ((uint32_t)m << 4));
}

// A block's 8 sub-block scales ls (6 bits) as bytes ls + 96 (no byte overflows: <= 159): ue holds
// groups 0, 2, 4, 6, uo groups 1, 3, 5, 7 (byte b = group 2b / 2b + 1). h0 = d | scales_h << 16,
// h1 = scales_l. The 2-bit high parts (scales_h bits 2j, 2j + 1) are spread nibble-wise into bytes
// first (nibble b of scales_h = groups 2b, 2b + 1): ~12 ALU operations for 8 scales.
TF_DEV void tf_mmh_iq4_ls(uint32_t h0, uint32_t h1, uint32_t& ue, uint32_t& uo) {
  uint32_t x = h0 >> 16;
  x = (x | (x << 8)) & 0x00FF00FFu;
  x = (x | (x << 4)) & 0x0F0F0F0Fu;
  ue = ((h1 & 0x0F0F0F0Fu) | ((x << 4) & 0x30303030u)) + 0x60606060u;
  uo = (((h1 >> 4) & 0x0F0F0F0Fu) | ((x << 2) & 0x30303030u)) + 0x60606060u;
}
// byte b of u (= ls + 96) -> ls - 32 as fp32, exactly: the bits 0x4B0000uu are 2^23 + uu
TF_DEV float tf_mmh_ls_f32(uint32_t u, int b) {
  return tf_bits_f32(tf_prmt(u, 0x4B000000u, 0x7440u | (uint32_t)b)) - 8388736.f;
}

#if TF_DEVICE
// The table (dynamic shared memory, LUT_BYTES). At namespace scope so that its PTX name is plain:
// tf_mmh_iq4 takes its window offset with a mov of the symbol, which ptxas resolves, where a
// generic-to-shared conversion reads the CTA's cluster id and costs an add per lookup.
extern __shared__ __align__(16) uint32_t tf_mmh_lut[];

TF_DEV void tf_mmh_bf16(const uint32_t (&a)[4], const uint32_t (&b)[2], float (&d)[4]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// D = A . B (no accumulator input: C is the zero register)
TF_DEV void tf_mmh_bf16_first(const uint32_t (&a)[4], const uint32_t (&b)[2], float (&d)[4]) {
  const float z = 0.f;
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%10,%10,%10,%10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(z));
}
// (lo, hi) -> bf16x2 with lo in the low half (cvt's first source goes to the HIGH half)
TF_DEV uint32_t tf_mmh_pack(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// lut: the table's shared-window address (32 bits); off from tf_mmh_addr
TF_DEV uint32_t tf_mmh_lds(uint32_t lut, uint32_t off) {
  uint32_t v;
  asm("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(lut + off));
  return v;
}

// Fill the table (every CTA its own copy: 8 STS.128 per thread for the 32 words each row uses).
TF_DEV void tf_mmh_fill_iq4(uint32_t* lut) {
  for (int i = threadIdx.x; i < 256 * 8; i += TF_MMH_THREADS) {
    const uint32_t e = (uint32_t)i >> 3, v = tf_mmh_iq4_entry(e);
    *(uint4*)(lut + e * 64 + (i & 7) * 4) = make_uint4(v, v, v, v);
  }
  __syncthreads();
}

// One block's raw words for the lane's 2 * RT rows: header pair (d | scales_h << 16, scales_l)
// and the 8 qs words (bytes 16j + 4t .. 16j + 4t + 3 of group j).
template <int RT> struct tf_mmh_raw { uint32_t h[2 * RT][2], q[2 * RT][8]; };

template <int RT>
TF_DEV void tf_mmh_load(tf_mmh_raw<RT>& r, const uint8_t* const __restrict__ (&wr)[2 * RT], int b,
                        int t) {
#pragma unroll
  for (int i = 0; i < 2 * RT; ++i) {
    const uint8_t* blk = wr[i] + (uint64_t)b * 136;
    tf_mma_ld8(blk, r.h[i][0], r.h[i][1]);
#pragma unroll
    for (int j = 0; j < 8; ++j) r.q[i][j] = tf_ld_u32(blk + 8 + 16 * j + 4 * t);
  }
}

// acc[rt] += block b's product of row tile rt (rows g, g + 8) with the lane's B column (xb: x of
// that column at the block's first element + 4t; xon: the column exists).
template <int RT>
TF_DEV void tf_mmh_block(const tf_mmh_raw<RT>& r, const float* __restrict__ xb, bool xon,
                         uint32_t lut, uint32_t l4, float (&acc)[RT][1][4]) {
  // the 8 group scales of each row: (ls - 32) as fp32, d applied once per block
  float dd[2 * RT];
  uint32_t ue[2 * RT], uo[2 * RT];
#pragma unroll
  for (int i = 0; i < 2 * RT; ++i) {
    dd[i] = tf_h2f((uint16_t)r.h[i][0]);
    tf_mmh_iq4_ls(r.h[i][0], r.h[i][1], ue[i], uo[i]);
  }
  float accb[RT][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    uint32_t b1[2] = {0u, 0u}, b2[2] = {0u, 0u};
    if (xon) {
      const float4 v0 = *(const float4*)(xb + 32 * j), v1 = *(const float4*)(xb + 32 * j + 16);
      b1[0] = tf_mmh_pack(v0.x, v1.x);   // elements 4t, 4t+16
      b1[1] = tf_mmh_pack(v0.y, v1.y);   // 4t+1, 4t+17
      b2[0] = tf_mmh_pack(v0.z, v1.z);   // 4t+2, 4t+18
      b2[1] = tf_mmh_pack(v0.w, v1.w);   // 4t+3, 4t+19
    }
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      const uint32_t w0 = r.q[2 * rt][j], w1 = r.q[2 * rt + 1][j];
      const uint32_t a1[4] = {tf_mmh_lds(lut, tf_mmh_addr(w0, l4, 0)),
                              tf_mmh_lds(lut, tf_mmh_addr(w1, l4, 0)),
                              tf_mmh_lds(lut, tf_mmh_addr(w0, l4, 1)),
                              tf_mmh_lds(lut, tf_mmh_addr(w1, l4, 1))};
      const uint32_t a2[4] = {tf_mmh_lds(lut, tf_mmh_addr(w0, l4, 2)),
                              tf_mmh_lds(lut, tf_mmh_addr(w1, l4, 2)),
                              tf_mmh_lds(lut, tf_mmh_addr(w0, l4, 3)),
                              tf_mmh_lds(lut, tf_mmh_addr(w1, l4, 3))};
      float d[4];
      tf_mmh_bf16_first(a1, b1, d);
      tf_mmh_bf16(a2, b2, d);
      const float f0 = tf_mmh_ls_f32(j & 1 ? uo[2 * rt] : ue[2 * rt], j >> 1);
      const float f1 = tf_mmh_ls_f32(j & 1 ? uo[2 * rt + 1] : ue[2 * rt + 1], j >> 1);
      if (j == 0) {
        accb[rt][0] = f0 * d[0]; accb[rt][1] = f0 * d[1];
        accb[rt][2] = f1 * d[2]; accb[rt][3] = f1 * d[3];
      } else {
        accb[rt][0] += f0 * d[0]; accb[rt][1] += f0 * d[1];
        accb[rt][2] += f1 * d[2]; accb[rt][3] += f1 * d[3];
      }
    }
  }
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
    acc[rt][0][0] += dd[2 * rt] * accb[rt][0];
    acc[rt][0][1] += dd[2 * rt] * accb[rt][1];
    acc[rt][0][2] += dd[2 * rt + 1] * accb[rt][2];
    acc[rt][0][3] += dd[2 * rt + 1] * accb[rt][3];
  }
}

// A kernel's start: the CTA's table filled, its shared-window offset (a constant ptxas folds into
// each LDS), and the warp's stream-K item range over (16 * RT-row tile groups) x blocks.
template <int RT>
TF_DEV uint32_t tf_mmh_begin(int n_out, int K, int& it, int& iend) {
  tf_mmh_fill_iq4(tf_mmh_lut);
  uint32_t lut;
  asm("mov.u32 %0, tf_mmh_lut;" : "=r"(lut));
  const tf_mma_ix items = (tf_mma_ix)((n_out + 16 * RT - 1) / (16 * RT)) * (K >> 8);
  tf_mma_warp_range(items, it, iend);
  return lut;
}

// A tile group's start: the lane's row pointers (rows g and g + 8 of each 16-row tile; rows past
// n_out read row n_out - 1, never stored) and zeroed accumulators.
template <int RT>
TF_DEV void tf_mmh_tile_start(const uint8_t* __restrict__ W, int tg, int g, int n_out, int nb,
                              const uint8_t* __restrict__ (&wr)[2 * RT], float (&acc)[RT][1][4]) {
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
    const int ra = (tg * RT + rt) * 16 + g, rb = ra + 8;
    wr[2 * rt] = W + (uint64_t)(ra < n_out ? ra : n_out - 1) * nb * 136;
    wr[2 * rt + 1] = W + (uint64_t)(rb < n_out ? rb : n_out - 1) * nb * 136;
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[rt][0][i] = 0.f;
  }
}

// tf_mmh_iq4<RT>: RT 16-row tiles per warp, one IQ4_XS block per work item (the stream-K split of
// tf_mma_rt with U = 1: items = tile groups x blocks per row, one wave of resident warps, the
// deterministic fixup for tile groups cut between warps). A block's raw words are loaded, then
// used: keeping the next block's loads in flight (registers for 2-4 blocks), more warps per SM
// (3 CTAs at 80 registers), staging through a cp.async ring, loads that skip L1 and L2 prefetches
// were each measured slower (session 17, bench/NOTES.md).
// x: fp32 [ncols, K]; y: fp32 [ncols, n_out]. Columns past ncols are zero in B and never stored;
// rows past n_out read row n_out - 1 and are never stored.
template <int RT>
__global__ void __launch_bounds__(TF_MMH_THREADS, TF_MMH_MINB)
tf_mmh_iq4(const uint8_t* __restrict__ W, const float* __restrict__ x, float* __restrict__ y,
           int n_out, int K, int ncols, int* cnt, float* part) {
  int it, iend;
  const uint32_t lut = tf_mmh_begin<RT>(n_out, K, it, iend);
  constexpr int BB = 136;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const uint32_t l4 = 4u * (uint32_t)lane;
  const int nb = K >> 8;
  const int spt = nb;
  const bool xon = g < ncols;                    // this lane's B column exists
  const float* __restrict__ xc = x + (uint64_t)(xon ? g : 0) * K + 4 * t;
  while (it < iend) {                                        // warp-uniform
    const int tg = it / spt, s0 = it - tg * spt;
    const int s1 = spt < s0 + (iend - it) ? spt : s0 + (iend - it);
    const uint8_t* __restrict__ wr[2 * RT];
    float acc[RT][1][4];
    tf_mmh_tile_start<RT>(W, tg, g, n_out, nb, wr, acc);
    for (int b = s0; b < s1; ++b) {
      tf_mmh_raw<RT> raw;
      tf_mmh_load<RT>(raw, wr, b, t);
      tf_mmh_block<RT>(raw, xc + b * 256, xon, lut, l4, acc);
    }
    tf_mma_finish<RT, 1>(y, n_out, ncols, tg, g, t, s0 == 0 && s1 == spt, spt, cnt, part, acc);
    it += s1 - s0;
  }
}
#endif  // TF_DEVICE

// ---------------------------------------------------------------------------------------------
// tf_mmh2_iq4<RT> (kind "foldp"): the same table, the group scales folded into the weights, x
// given as bf16 pairs (session 18).
// Why: tf_mmh_iq4 loads 4 bytes per lane (a row's quad reads 16 contiguous bytes) because one
// product's 16 k slots must come from ONE group for its scale to apply after the product. Here
// every lane multiplies its table entries by its own group's s = bf16(d * (ls - 32)) (one
// mul.bf16x2 per two weights, replacing the per-group fp32 epilogue), so a product may mix groups:
// lane t of a row reads bytes 8t..8t+7 of each 32-byte segment of qs (one 8-byte load), and the
// tensor core accumulates the whole row. Weights are rounded to bf16 (8 significant bits, as x).
// x arrives as xpack / norm.PACK_LAYOUT writes it (per column and group of 32, the 16 words
// (x[i], x[i + 16]) as bf16x2): the lane's B operands of a segment are two 16-byte loads, the
// quad's one 128-byte line. Measured (H200, bench/mmh.py): 5120 -> 17408 at N = 5 26.7 us against
// 29.7 for tf_mmh_iq4, and ~flat from N = 1 to 8. Tried and slower or level, removed: fp32 x
// converted in the kernel (34.9 at RT = 1, 29.0 at RT = 2: x's loads then touch two lines per
// quad and cost 8 cvt per segment), 3 CTAs per SM (29.0), the next block's words in flight
// (26.3: within 2 %).
// Segment s, lane t: group j = 2s + (t >> 1), bytes 8(t & 1) + m (m = 0..7) = element pairs
// (e_m, e_m + 16), e_m = 32j + 8(t & 1) + m. Product p (0..3) of the segment takes bytes 2p
// (slots 2t, 2t+1) and 2p + 1 (slots 2t+8, 2t+9); B holds (x[e], x[e + 16]) of the same bytes.
TF_DEV uint32_t tf_mmh_mul(uint32_t a, uint32_t b) {
#if TF_DEVICE
  uint32_t r;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
#else   // host harness: the bf16 products, each rounded to nearest even
  uint32_t r = 0;
  for (int h = 0; h < 2; ++h) {
    const uint32_t ua = ((a >> (16 * h)) & 0xFFFFu) << 16, ub = ((b >> (16 * h)) & 0xFFFFu) << 16;
    float fa, fb; memcpy(&fa, &ua, 4); memcpy(&fb, &ub, 4);
    const float f = fa * fb;
    uint32_t v; memcpy(&v, &f, 4);
    r |= ((v + 0x7FFFu + ((v >> 16) & 1u)) >> 16) << (16 * h);
  }
  return r;
#endif
}

// Row i's scale for segment s as a bf16x2 splat: u = ue / uo (the lane's group parity), byte s.
TF_DEV uint32_t tf_mmh2_scale(uint32_t u, int s, float d) {
  const float f = tf_mmh_ls_f32(u, s) * d;
#if TF_DEVICE
  return tf_mmh_pack(f, f);
#else
  uint32_t v; memcpy(&v, &f, 4);
  v = (v + 0x7FFFu + ((v >> 16) & 1u)) >> 16;
  return v | (v << 16);
#endif
}

#if TF_DEVICE
// x: the packed pairs as uint32 [ncols, K / 2]; y: fp32 [ncols, n_out] (as tf_mmh_iq4)
template <int RT>
__global__ void __launch_bounds__(TF_MMH_THREADS, TF_MMH_MINB)
tf_mmh2_iq4(const uint8_t* __restrict__ W, const uint32_t* __restrict__ x, float* __restrict__ y,
            int n_out, int K, int ncols, int* cnt, float* part) {
  int it, iend;
  const uint32_t lut = tf_mmh_begin<RT>(n_out, K, it, iend);
  constexpr int BB = 136;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const uint32_t l4 = 4u * (uint32_t)lane;
  const int nb = K >> 8;
  const int spt = nb;
  const bool xon = g < ncols;
  const bool odd = (t >> 1) != 0;                 // the lane's groups are the odd ones
  // the word of pair e_0 in the lane's first segment (a column is K / 2 words)
  const uint32_t* __restrict__ xc = x + (uint64_t)(xon ? g : 0) * (K / 2) + 16 * (t >> 1) + 8 * (t & 1);
  while (it < iend) {                                        // warp-uniform
    const int tg = it / spt, s0 = it - tg * spt;
    const int s1 = spt < s0 + (iend - it) ? spt : s0 + (iend - it);
    const uint8_t* __restrict__ wr[2 * RT];
    float acc[RT][1][4];
    tf_mmh_tile_start<RT>(W, tg, g, n_out, nb, wr, acc);
    for (int b = s0; b < s1; ++b) {
      uint32_t h[2 * RT][2], q[2 * RT][8];     // q[i][2s + w]: word w of segment s
#pragma unroll
      for (int i = 0; i < 2 * RT; ++i) {
        const uint8_t* blk = wr[i] + (uint64_t)b * BB;
        tf_mma_ld8(blk, h[i][0], h[i][1]);
#pragma unroll
        for (int s = 0; s < 4; ++s) tf_mma_ld8(blk + 8 + 32 * s + 8 * t, q[i][2 * s], q[i][2 * s + 1]);
      }
      float dd[2 * RT];
      uint32_t us[2 * RT];
#pragma unroll
      for (int i = 0; i < 2 * RT; ++i) {
        uint32_t ue, uo;
        tf_mmh_iq4_ls(h[i][0], h[i][1], ue, uo);
        us[i] = odd ? uo : ue;
        dd[i] = tf_h2f((uint16_t)h[i][0]);
      }
      const uint32_t* __restrict__ xb = xc + b * 128;
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        uint32_t bx[8] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};   // byte m: (x[e_m], x[e_m + 16])
        if (xon) {
          const uint4 p0 = *(const uint4*)(xb + 32 * s), p1 = *(const uint4*)(xb + 32 * s + 4);
          bx[0] = p0.x; bx[1] = p0.y; bx[2] = p0.z; bx[3] = p0.w;
          bx[4] = p1.x; bx[5] = p1.y; bx[6] = p1.z; bx[7] = p1.w;
        }
#pragma unroll
        for (int rt = 0; rt < RT; ++rt) {
          const uint32_t sa = tf_mmh2_scale(us[2 * rt], s, dd[2 * rt]);
          const uint32_t sb = tf_mmh2_scale(us[2 * rt + 1], s, dd[2 * rt + 1]);
#pragma unroll
          for (int p = 0; p < 4; ++p) {
            const uint32_t w0 = q[2 * rt][2 * s + (p >> 1)], w1 = q[2 * rt + 1][2 * s + (p >> 1)];
            const int m0 = 2 * (p & 1);
            const uint32_t a[4] = {tf_mmh_mul(tf_mmh_lds(lut, tf_mmh_addr(w0, l4, m0)), sa),
                                   tf_mmh_mul(tf_mmh_lds(lut, tf_mmh_addr(w1, l4, m0)), sb),
                                   tf_mmh_mul(tf_mmh_lds(lut, tf_mmh_addr(w0, l4, m0 + 1)), sa),
                                   tf_mmh_mul(tf_mmh_lds(lut, tf_mmh_addr(w1, l4, m0 + 1)), sb)};
            const uint32_t bb[2] = {bx[2 * p], bx[2 * p + 1]};
            tf_mmh_bf16(a, bb, acc[rt][0]);
          }
        }
      }
    }
    tf_mma_finish<RT, 1>(y, n_out, ncols, tg, g, t, s0 == 0 && s1 == spt, spt, cnt, part, acc);
    it += s1 - s0;
  }
}
#endif  // TF_DEVICE
