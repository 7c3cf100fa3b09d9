// Decode attention over a QUANTIZED KV cache (issue 11), tensor-core version of
// tightfit/kernels/attn_decode_q.py::_attn_q_kernel (same buffers, same split-K partials).
//
// Compiled at run time with NVRTC (tightfit/kernels/attn_decode_q_cuda.py) and, with TF_HOST
// defined, by g++ against a SIMT emulator (tests/test_attn_decode_q_cuda.py) so CI can check
// the body against the float64 reference without a GPU. Configuration by macros:
//   HD (head dim, 128 or 256), KB/VB (code bits: 8 = q8_0, 4, 3, 2), KG/VG (values per fp16
//   scale, a multiple of 32), NW (warps per CTA), NST (cp.async stages per warp), CPB (bytes per
//   cp.async: 16/4), MINB (optional: __launch_bounds__ min CTAs per SM).
//
// One CTA per (chunk, KV head); each warp takes every NW-th tile of 16 cached rows of the chunk.
// Raw byte rows (K and V) are copied to a per-warp shared-memory ring with cp.async (NST-1 tiles
// in flight, no registers held; ring rows padded to 16 B so every row is 16-B aligned), then
// decoded straight into mma.sync m16n8k16 fragments. A dot product does not care in which order
// its dims are summed, so each format's dims are assigned to fragment slots in the order its
// code bits are cheapest to unpack ("layout-aware"); q's fragments (K side) and the output rows
// (V side) are permuted to match, at no cost in the loop:
//   scores  S[8 heads x 16 rows] = Q K^T: A = q (rows 0-7 the fp16 hi part of the group's heads,
//           rows 8-15 the lo part: one mma gives both), B = K^T decoded from the codes. Per
//           32-dim sub-block (two k-steps) thread (g = lane/4, c = lane%4) decodes 8 dims of rows
//           g and g+8 (kdim()): q8_0 / tq4: dims 8c..8c+7 (one 8-/4-byte word); tq3 / tq2: dims
//           c + 4j (j = 0..7): the 2-bit plane's 8 bytes gathered into even/odd bytes with PRMT,
//           code 8k + c's field then sits at bits 2c of byte k of the even word and code 8k + 4 + c's
//           at bits 2c of byte k of the odd word, the high-bit
//           plane's word rotated by c - 2 puts the high bits of codes c + 8k / c + 4 + 8k at
//           bits 2 / 6 of byte k: one 32-bit selector of 8 PRMT nibble indices from 2 shifts,
//           1 rotate and 3 LOP3 (was ~13 bit operations and 2 byte loads per 4 codes). The codes
//           are UNSCALED (int8 / C[idx] are exact in fp16, C[idx] rounded once) and looked up
//           with PRMT on fp16 byte tables; each block of G dims is accumulated separately and
//           multiplied by its fp32 scale (so K is never rounded after scaling: q8_0 scores are
//           exact products).
//   output  O^T[D x 8 heads] += V^T P^T: A = V^T (thread g owns D/8 dims of one norm block and
//           rows 2c, 2c+1, 2c+8, 2c+9), B = P^T straight from the score accumulators (p split
//           into fp16 hi + lo: two mmas), fp32 accumulation. The values are C[idx] * s rounded
//           once in fp16 (one HMUL2 per pair, as the FP16 cache / the Triton kernel round them).
//           q8_0 / tq4: per row 4 consecutive dims, transposed 2x2 with PRMT; tq3 / tq2: the
//           selector interleaves two ROWS (nibble 0 / 1 of each byte: dims 8k + r of rows
//           2c / 2c+1), so the table lookups come out as {row a, row b} pairs of one dim, the
//           A fragment directly (vdim()).
// Online softmax in log2 units per warp; the warps of a CTA are merged through shared memory
// (safe max/denominator merge), then: n_chunks = 1 -> o_rot = acc / l; split-K -> (m, l, acc)
// partials for attn_decode_q._reduce_q_kernel (rows per CTA: _chunk_rows with BT = 16).
#ifndef TF_ATTN_Q_CUH
#define TF_ATTN_Q_CUH

#ifndef TF_HOST
// ------------------------------------------------------------------ device (NVRTC) primitives
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
typedef long long i64;
#define TF_DEV __device__ __forceinline__
#define TF_NEG_INF (-__int_as_float(0x7f800000))
TF_DEV int tf_tid() { return (int)threadIdx.x; }
TF_DEV int tf_bx() { return (int)blockIdx.x; }
TF_DEV int tf_by() { return (int)blockIdx.y; }
TF_DEV u32 prmt(u32 a, u32 b, u32 s) {
    u32 d; asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(s)); return d;
}
TF_DEV u32 f2h2(float lo, float hi) {      // {lo -> bits 0..15, hi -> bits 16..31}, RN
    u32 d; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo)); return d;
}
TF_DEV u32 f2h(float x) {
    unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x)); return h;
}
TF_DEV float h2f(u32 h16) {
    float f; unsigned short h = (unsigned short)h16;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
TF_DEV u32 hmul2(u32 a, u32 b) { u32 d; asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d; }
TF_DEV u32 hadd2(u32 a, u32 b) { u32 d; asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d; }
TF_DEV float ex2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
TF_DEV float shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
TF_DEV float shfl_idx(float v, int src) { return __shfl_sync(0xffffffffu, v, src); }
TF_DEV void syncwarp() { __syncwarp(); }
TF_DEV bool warp_any(bool p) { return __any_sync(0xffffffffu, p) != 0; }
TF_DEV void syncthreads() { __syncthreads(); }
TF_DEV void mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
TF_DEV void cp_async(void* dst, const void* src, int nbytes_valid) {
    u32 d = (u32)__cvta_generic_to_shared(dst);
#if CPB == 16
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(d), "l"(src), "r"(nbytes_valid));
#else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(d), "l"(src), "r"(nbytes_valid));
#endif
}
TF_DEV void cp_commit() { asm volatile("cp.async.commit_group;"); }
TF_DEV u32 rotr(u32 x, u32 n) { return __funnelshift_r(x, x, n); }   // rotate right by n % 32
TF_DEV u32 ld32(const u8* p) { return *(const u32*)p; }
TF_DEV u32 ld16(const u8* p) { return *(const u16*)p; }
TF_DEV void ld64(const u8* p, u32& a, u32& b) { uint2 v = *(const uint2*)p; a = v.x; b = v.y; }
TF_DEV void ld128(const u8* p, u32* d) {
    uint4 v = *(const uint4*)p; d[0] = v.x; d[1] = v.y; d[2] = v.z; d[3] = v.w;
}
template <int N> TF_DEV void cp_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N)); }
#define TF_SMEM_DECL extern __shared__ __align__(16) u8 tf_smem[];
// PDL (tightfit/kernels/pdl.py): built in only with TF_PDL (attn_decode_q_cuda defines it exactly
// when it launches with the PDL attribute) and on sm_90+; the memory clobber keeps every access
// of the kernel below the wait.
TF_DEV void gdc_wait() {
#if defined(TF_PDL) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
TF_DEV void gdc_launch_dependents() {
#if defined(TF_PDL) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
#else
// ------------------------------------------------------------------ host (g++) SIMT emulator
#include "attn_q_host_emu.h"
TF_DEV void gdc_wait() {}                 // one CTA at a time, in stream order
TF_DEV void gdc_launch_dependents() {}
#endif

#ifndef CPB
#define CPB 16
#endif
#define TF_RB(B, G) ((HD / (G)) * ((G) * (B) / 8 + 2))       // bytes of one cached row
#define TF_RS(B, G) ((TF_RB(B, G) + 15) / 16 * 16)            // its stride in the ring
// The closing merge's accumulator rows in shared memory: dim d sits at d + d / 32 (one spare
// float per 32) in rows of TF_ACC_RS floats. A warp's store of one fragment register has lane
// (g, c) write row 2c (+1), dim vdim(i, half, g) = 32 g + k (head dim 256; 3-/2-bit V at 128
// too) or 16 g + k (4-/8-bit V at 128); with the spare float per 32 the g's fall in 8 distinct
// banks (0..7, or 0..3 and 16..19) and the row stride spreads the c's over the rest: stride = 4
// mod 16, or 2 mod 4. The plain [HD]-float rows put all 32 lanes in one bank (ncu, session 9:
// 89 % of the kernel's shared wavefronts were this conflict; ~9 us of 15.6 at 64 rows).
#define TF_ACC_BASE (HD + HD / 32)
#define TF_ACC_RS (((HD) == 128 && VB >= 4) ? TF_ACC_BASE + (6 - TF_ACC_BASE % 4) % 4 \
                                             : TF_ACC_BASE + (20 - TF_ACC_BASE % 16) % 16)

struct CbTab { u32 l0, l1, h0, h1, l2, l3, h2, h3; };   // fp16 low / high bytes of C[0..15]

TF_DEV CbTab make_tab(const float* cb) {
    u32 lo[4] = {0u, 0u, 0u, 0u}, hi[4] = {0u, 0u, 0u, 0u};
    for (int i = 0; i < 16; i++) {
        u32 h = f2h(cb[i]);
        lo[i >> 2] |= (h & 255u) << (8 * (i & 3));
        hi[i >> 2] |= (h >> 8) << (8 * (i & 3));
    }
    CbTab t;
    t.l0 = lo[0]; t.l1 = lo[1]; t.l2 = lo[2]; t.l3 = lo[3];
    t.h0 = hi[0]; t.h1 = hi[1]; t.h2 = hi[2]; t.h3 = hi[3];
    return t;
}

// ---- fp16 pairs from codes. Each returns two words: {v0, v1}, {v2, v3} of the 4 codes it gets.
// q8_0: 4 int8 of a word -> fp16 exactly: (x ^ 0x80) | 0x6400 = 1024 + x + 128, then - 1152
TF_DEV void dq8(u32 w, u32& o0, u32& o1) {
    w ^= 0x80808080u;
    o0 = hadd2(prmt(w, 0x64646464u, 0x4140u), 0xE480E480u);
    o1 = hadd2(prmt(w, 0x64646464u, 0x4342u), 0xE480E480u);
}
// 4-bit: j = 4 nibble indices & 7, s = 0x3210 | bit 3 of each nibble at bit 2 (low 16 bits used):
// two 8-entry lookups per byte plane, byte select by bit 3
TF_DEV void dq4(const CbTab& T, u32 j, u32 s, u32& o0, u32& o1) {
    const u32 lo = prmt(prmt(T.l0, T.l1, j), prmt(T.l2, T.l3, j), s);
    const u32 hi = prmt(prmt(T.h0, T.h1, j), prmt(T.h2, T.h3, j), s);
    o0 = prmt(lo, hi, 0x5140u);
    o1 = prmt(lo, hi, 0x7362u);
}
// 3-/2-bit: 4 selector nibbles (low 16 bits) = 8-entry indices (bit 3 always 0)
TF_DEV void dq3(const CbTab& T, u32 sel, u32& o0, u32& o1) {
    const u32 lo = prmt(T.l0, T.l1, sel), hi = prmt(T.h0, T.h1, sel);
    o0 = prmt(lo, hi, 0x5140u);
    o1 = prmt(lo, hi, 0x7362u);
}

// ---- K side: dim of q / K for k-step 2*sb + h, B-fragment slot j (0,1: b0; 2,3: b1), lane c
template <int BITS>
TF_DEV int kdim(int sb, int h, int j, int c) {
    return (BITS == 3 || BITS == 2) ? 32 * sb + 16 * h + c + 4 * j : 32 * sb + 8 * c + 4 * h + j;
}
// B fragments of one cached row for the two k-steps of 32-dim sub-block sb:
// kb[0], kb[1] = (b0, b1) of k-step 2sb, kb[2], kb[3] = (b0, b1) of k-step 2sb + 1.
template <int BITS>
TF_DEV void deck(const u8* row, int sb, int c, const CbTab& T, u32* kb) {
    if constexpr (BITS == 8) {             // dims 8c .. 8c+7 of the sub-block: one 8-byte word
        u32 w0, w1;
        ld64(row + 32 * sb + 8 * c, w0, w1);
        dq8(w0, kb[0], kb[1]);
        dq8(w1, kb[2], kb[3]);
    } else if constexpr (BITS == 4) {      // dims 8c .. 8c+7: one word of 8 nibbles
        const u32 w = ld32(row + 16 * sb + 4 * c);
        const u32 J = w & 0x77777777u, S = ((w >> 1) & 0x44444444u) | 0x32103210u;
        dq4(T, J, S, kb[0], kb[1]);
        dq4(T, J >> 16, S >> 16, kb[2], kb[3]);
    } else {                               // dims c + 4j: codes 8k + c (j = 2k) and 8k + 4 + c
        u32 L0, L1;
        ld64(row + 8 * sb, L0, L1);        // the sub-block's 2-bit plane: code i at bits 2i
        const u32 E = prmt(L0, L1, 0x6420u), O = prmt(L0, L1, 0x7531u);   // bytes 2k / 2k+1
        u32 sel = ((E >> (2 * c)) & 0x03030303u) | (rotr(O, 2 * c - 4) & 0x30303030u);
        if (BITS == 3)                     // high bit of code i at bit i of the plane's word
            sel |= rotr(ld32(row + HD / 4 + 4 * sb), c - 2) & 0x44444444u;
        dq3(T, sel, kb[0], kb[1]);
        dq3(T, sel >> 16, kb[2], kb[3]);
    }
}

// ---- V side: output dim of m-tile i, row g (half 0) or g + 8 (half 1), for lane group g
template <int BITS>
TF_DEV int vdim(int i, int half, int g) {
    constexpr int VPT = HD / 8;
    if (BITS == 3 || BITS == 2) {          // block of 32 dims: (VPT g) / 32, r = r0 + i / 2
        const int blk = (VPT * g) >> 5, r0 = ((VPT * g) & 31) >> 2;
        return 32 * blk + 16 * (i & 1) + 8 * half + r0 + (i >> 1);
    }
    return VPT * g + 2 * i + half;
}
// 3-/2-bit V: selector of two rows a, b (nibbles 0 / 1 of byte k: dims 8k + r) from each row's
// even/odd gathered 2-bit words (LA/LB: the one holding code r, field at bits 2(r % 4)) and
// high-bit words (HA, HB)
template <int BITS>
TF_DEV u32 vsel(u32 LA, u32 LB, u32 HA, u32 HB, int r) {
    const int q = 2 * (r & 3);
    u32 s = ((LA >> q) & 0x03030303u) | (rotr(LB, q - 4) & 0x30303030u);
    if (BITS == 3)
        s |= (rotr(HA, r - 2) & 0x04040404u) | (rotr(HB, r - 6) & 0x40404040u);
    return s;
}

TF_DEV float ld_scale(const u8* row, int off) { return h2f(ld16(row + off)); }

TF_DEV void attn_q_body(const float* q_rot, const u8* kc, const u8* vc, const float* kcb,
                        const float* vcb, float* o, float* m_ws, float* l_ws, float* acc_ws,
                        const int* status, int Hkv, int GRP, int NCH, int NL, int CHUNK,
                        int MINR, float qk_scale, int split, u8* smem) {
    constexpr int RBK = TF_RB(KB, KG), RBV = TF_RB(VB, VG);
    constexpr int RSK = TF_RS(KB, KG), RSV = TF_RS(VB, VG);
    constexpr int CBK = HD * KB / 8, CBV = HD * VB / 8;
    constexpr int KS = HD / 16;                 // k-steps of the score dot / m-tiles of O^T
    constexpr int STAGE = 16 * (RSK + RSV);
    constexpr int VPT = HD / 8;                 // V dims per thread row group
    const int tid = tf_tid(), lane = tid & 31, w = tid >> 5, g = lane >> 2, c = lane & 3;
    const int chunk = tf_bx(), kvh = tf_by();
    // PDL: status, q and the cache rows come from the kernels before this one (the codebooks
    // too, conservatively): nothing is read before the wait, which every thread executes.
    gdc_wait();
    const int T = status[2] + 1;
    int start = 0, end = T;
    if (split) {
        int ch = (T + NL - 1) / NL;
        ch = ((ch + 15) / 16) * 16;
        int mn = CHUNK < MINR ? CHUNK : MINR;
        ch = ch > mn ? ch : mn;
        start = chunk * ch;
        end = start + ch < T ? start + ch : T;
    }
    const int ntiles = end > start ? (end - start + 15) / 16 : 0;
    const int ntw = ntiles > w ? (ntiles - w + NW - 1) / NW : 0;

    // split-K: a CTA past the last row has nothing to write either (the merge reads only the
    // chunks holding rows, nv = ceil(T / rows per CTA)): leave before any setup (at depth 0 all
    // but one CTA per KV head; CTA-uniform, so no barrier is skipped by part of the CTA)
    if (split && ntiles == 0) return;

    u32* qsm = (u32*)smem;                              // [KS][32 lanes][4] A fragments of q
    u8* ring = smem + KS * 32 * 16;
    // the first tiles' cp.async copies go out before the q / codebook setup below, so their
    // DRAM latency overlaps it (the ring does not overlap the q fragments)
    u8* wring = ring + w * NST * STAGE;
    // issue the raw rows of this warp's tile `it` into ring slot it % NST (always commits).
    // Chunk i = lane + 32 j of a tile is (row r = i / NK, piece i % NK): its 32-bit global offset
    // from the tile's first row is lane-only, so it is computed once; it is < nval * row stride
    // exactly when r < nval (the rows that exist). Per chunk: compare, select, 64-bit add, copy.
    constexpr int NK = RBK / CPB, NV = RBV / CPB;
    constexpr int JK = (16 * NK + 31) / 32, JV = (16 * NV + 31) / 32;
    const int gsk = Hkv * RBK, gsv = Hkv * RBV;              // global row strides (bytes)
    // (precomputed into registers when there are few chunks per lane: 16-B copies)
    constexpr bool PRE = JK + JV <= 18;
    auto ofs = [&](int j, int n, int gs) -> int {
        const int i = lane + 32 * j, r = i / n;
        return i < 16 * n ? r * gs + (i - r * n) * CPB : 1 << 30;
    };
    int koff[PRE ? JK : 1], voff[PRE ? JV : 1];
    if constexpr (PRE) {
#pragma unroll
        for (int j = 0; j < JK; j++) koff[j] = ofs(j, NK, gsk);
#pragma unroll
        for (int j = 0; j < JV; j++) voff[j] = ofs(j, NV, gsv);
    }
    auto issue = [&](int it) {
        if (it < ntw) {
            const int t0 = start + (w + it * NW) * 16;
            const int nval = end - t0;                        // rows of the tile that exist
            u8* dst = wring + (it % NST) * STAGE;
            const u8* kb = kc + ((i64)t0 * Hkv + kvh) * RBK;
            const u8* vb = vc + ((i64)t0 * Hkv + kvh) * RBV;
            const int klim = nval * gsk, vlim = nval * gsv;   // nval <= chunk rows: no overflow
            auto one = [&](int j, int of, int n, int rs, int lim, const u8* src, u8* d0) {
                const int i = lane + 32 * j, r = i / n;
                const bool ok = of < lim;
                cp_async(d0 + (rs == n * CPB ? i * CPB : r * rs + (i - r * n) * CPB),
                         src + (ok ? of : 0), ok ? CPB : 0);
            };
            if constexpr (PRE) {
#pragma unroll
                for (int j = 0; j < JK; j++)
                    if ((16 * NK) % 32 == 0 || lane + 32 * j < 16 * NK)
                        one(j, koff[PRE ? j : 0], NK, RSK, klim, kb, dst);
#pragma unroll
                for (int j = 0; j < JV; j++)
                    if ((16 * NV) % 32 == 0 || lane + 32 * j < 16 * NV)
                        one(j, voff[PRE ? j : 0], NV, RSV, vlim, vb, dst + 16 * RSK);
            } else {                                          // many small copies: a loop
#pragma unroll 1
                for (int j = 0; j < JK; j++)
                    if (lane + 32 * j < 16 * NK) one(j, ofs(j, NK, gsk), NK, RSK, klim, kb, dst);
#pragma unroll 1
                for (int j = 0; j < JV; j++)
                    if (lane + 32 * j < 16 * NV)
                        one(j, ofs(j, NV, gsv), NV, RSV, vlim, vb, dst + 16 * RSK);
            }
        }
        cp_commit();
    };
    for (int p = 0; p < NST - 1; p++) issue(p);

    for (int i = tid; i < KS * 32; i += NW * 32) {
        const int s = i >> 5, ln = i & 31, gg = ln >> 2, cc = ln & 3;
        float v[4];
        for (int j = 0; j < 4; j++)
            v[j] = gg < GRP ? q_rot[(i64)(kvh * GRP + gg) * HD + kdim<KB>(s >> 1, s & 1, j, cc)]
                                  * qk_scale : 0.f;
        u32 h01 = f2h2(v[0], v[1]), h23 = f2h2(v[2], v[3]);
        qsm[4 * i + 0] = h01;
        qsm[4 * i + 1] = f2h2(v[0] - h2f(h01 & 0xFFFFu), v[1] - h2f(h01 >> 16));
        qsm[4 * i + 2] = h23;
        qsm[4 * i + 3] = f2h2(v[2] - h2f(h23 & 0xFFFFu), v[3] - h2f(h23 >> 16));
    }
    const CbTab KT = make_tab(kcb), VT = make_tab(vcb);
    syncthreads();

    float m_run = TF_NEG_INF, l_run = 0.f;
    float acc[KS][4];
    for (int i = 0; i < KS; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    const int tv0 = 2 * c, tv1 = 2 * c + 1, tv2 = 2 * c + 8, tv3 = 2 * c + 9;

    for (int it = 0; it < ntw; it++) {
        cp_wait<NST - 2>();
        syncwarp();
        issue(it + NST - 1);
        const u8* kst = wring + (it % NST) * STAGE;
        const u8* vst = kst + 16 * RSK;
        const int t0 = start + (w + it * NW) * 16;
        // ---- scores: per norm block, unscaled codes, then * fp32 scale
        float S[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
        const u8* kr0 = kst + g * RSK;           // B-fragment rows: g (n-tile 0), g + 8 (1)
        const u8* kr1 = kst + (g + 8) * RSK;
#pragma unroll 1
        for (int b = 0; b < HD / KG; b++) {
            float t0a[4] = {0.f, 0.f, 0.f, 0.f}, t1a[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int u = 0; u < KG / 32; u++) {
                const int sb = b * (KG / 32) + u;
                u32 k0[4], k1[4], qa[4];
                deck<KB>(kr0, sb, c, KT, k0);
                deck<KB>(kr1, sb, c, KT, k1);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    ld128((const u8*)(qsm + 4 * ((2 * sb + h) * 32 + lane)), qa);
                    mma16816(t0a, qa[0], qa[1], qa[2], qa[3], k0[2 * h], k0[2 * h + 1]);
                    mma16816(t1a, qa[0], qa[1], qa[2], qa[3], k1[2 * h], k1[2 * h + 1]);
                }
            }
            const int so = CBK + 2 * b;
            S[0][0] += ld_scale(kst + tv0 * RSK, so) * (t0a[0] + t0a[2]);
            S[0][1] += ld_scale(kst + tv1 * RSK, so) * (t0a[1] + t0a[3]);
            S[1][0] += ld_scale(kst + tv2 * RSK, so) * (t1a[0] + t1a[2]);
            S[1][1] += ld_scale(kst + tv3 * RSK, so) * (t1a[1] + t1a[3]);
        }
        float sc[4] = {S[0][0], S[0][1], S[1][0], S[1][1]};
        const int tt[4] = {tv0, tv1, tv2, tv3};
        for (int j = 0; j < 4; j++)
            if (t0 + tt[j] >= end) sc[j] = TF_NEG_INF;
        // ---- online softmax (head g; the 4 lanes of a quad hold its 16 rows)
        float mx = fmaxf(fmaxf(sc[0], sc[1]), fmaxf(sc[2], sc[3]));
        mx = fmaxf(mx, shfl_xor(mx, 1));
        mx = fmaxf(mx, shfl_xor(mx, 2));
        const float m_new = fmaxf(m_run, mx);
        float alpha = 1.f, p[4] = {0.f, 0.f, 0.f, 0.f};
        if (m_new != TF_NEG_INF) {
            alpha = ex2(m_run - m_new);
            for (int j = 0; j < 4; j++) p[j] = ex2(sc[j] - m_new);
        }
        l_run = l_run * alpha + (p[0] + p[1]) + (p[2] + p[3]);
        m_run = m_new;
        const float al0 = shfl_idx(alpha, 8 * c), al1 = shfl_idx(alpha, 8 * c + 4);
        if (warp_any(alpha != 1.f)) {      // the running max rarely moves after a few tiles
#pragma unroll
            for (int i = 0; i < KS; i++) {
                acc[i][0] *= al0; acc[i][1] *= al1; acc[i][2] *= al0; acc[i][3] *= al1;
            }
        }
        const u32 ph0 = f2h2(p[0], p[1]), ph1 = f2h2(p[2], p[3]);
        const u32 pl0 = f2h2(p[0] - h2f(ph0 & 0xFFFFu), p[1] - h2f(ph0 >> 16));
        const u32 pl1 = f2h2(p[2] - h2f(ph1 & 0xFFFFu), p[3] - h2f(ph1 >> 16));
        // ---- O^T += V^T P^T: thread row group g owns VPT dims of one norm block (vdim)
        const int vso = CBV + 2 * ((VPT * g) / VG);
        const u8* vr0 = vst + tv0 * RSV;
        const u8* vr1 = vst + tv1 * RSV;
        const u8* vr2 = vst + tv2 * RSV;
        const u8* vr3 = vst + tv3 * RSV;
        if constexpr (VB == 3 || VB == 2) {
            // rows (tv0, tv1) and (tv2, tv3) interleaved in one selector: {row a, row b} pairs
            const int blk = (VPT * g) >> 5, r0 = ((VPT * g) & 31) >> 2;
            const u32 s01 = prmt(ld16(vr0 + vso), ld16(vr1 + vso), 0x5410u);
            const u32 s23 = prmt(ld16(vr2 + vso), ld16(vr3 + vso), 0x5410u);
            u32 L[4][2], H[4] = {0u, 0u, 0u, 0u};
            const u8* vr[4] = {vr0, vr1, vr2, vr3};
#pragma unroll
            for (int t = 0; t < 4; t++) {
                u32 a, bb;
                ld64(vr[t] + 8 * blk, a, bb);
                L[t][0] = prmt(a, bb, 0x6420u);          // codes 8k + 0..3
                L[t][1] = prmt(a, bb, 0x7531u);          // codes 8k + 4..7
                if (VB == 3) H[t] = ld32(vr[t] + HD / 4 + 4 * blk);
            }
#pragma unroll
            for (int ri = 0; ri < VPT / 4; ri++) {
                const int r = r0 + ri;
                const bool e = (VPT == 32) ? (ri >> 2) != 0 : r0 != 0;   // even / odd word
                const u32 sA = vsel<VB>(e ? L[0][1] : L[0][0], e ? L[1][1] : L[1][0], H[0], H[1], r);
                const u32 sB = vsel<VB>(e ? L[2][1] : L[2][0], e ? L[3][1] : L[3][0], H[2], H[3], r);
                u32 x[4], y[4];
                dq3(VT, sA, x[0], x[1]);
                dq3(VT, sA >> 16, x[2], x[3]);
                dq3(VT, sB, y[0], y[1]);
                dq3(VT, sB >> 16, y[2], y[3]);
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const u32 a0 = hmul2(x[2 * hh], s01), a1 = hmul2(x[2 * hh + 1], s01);
                    const u32 a2 = hmul2(y[2 * hh], s23), a3 = hmul2(y[2 * hh + 1], s23);
                    float* ac = acc[2 * ri + hh];
                    mma16816(ac, a0, a1, a2, a3, ph0, ph1);
                    mma16816(ac, a0, a1, a2, a3, pl0, pl1);
                }
            }
        } else {
            const u32 s0 = prmt(ld16(vr0 + vso), 0u, 0x1010u);
            const u32 s1 = prmt(ld16(vr1 + vso), 0u, 0x1010u);
            const u32 s2 = prmt(ld16(vr2 + vso), 0u, 0x1010u);
            const u32 s3 = prmt(ld16(vr3 + vso), 0u, 0x1010u);
#pragma unroll
            for (int k = 0; k < VPT / 4; k++) {
                const int e = VPT * g + 4 * k;
                u32 x0[2], x1[2], x2[2], x3[2];
                if constexpr (VB == 8) {
                    dq8(ld32(vr0 + e), x0[0], x0[1]);
                    dq8(ld32(vr1 + e), x1[0], x1[1]);
                    dq8(ld32(vr2 + e), x2[0], x2[1]);
                    dq8(ld32(vr3 + e), x3[0], x3[1]);
                } else {                                 // 4 nibbles of each row (u16)
                    u32* xs[4] = {x0, x1, x2, x3};
                    const u8* vr[4] = {vr0, vr1, vr2, vr3};
#pragma unroll
                    for (int t = 0; t < 4; t++) {
                        const u32 wd = ld16(vr[t] + e / 2);
                        dq4(VT, wd & 0x7777u, ((wd >> 1) & 0x4444u) | 0x3210u, xs[t][0], xs[t][1]);
                    }
                }
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const u32 y0 = hmul2(x0[hh], s0), y1 = hmul2(x1[hh], s1);
                    const u32 y2 = hmul2(x2[hh], s2), y3 = hmul2(x3[hh], s3);
                    const u32 a0 = prmt(y0, y1, 0x5410u), a1 = prmt(y0, y1, 0x7632u);
                    const u32 a2 = prmt(y2, y3, 0x5410u), a3 = prmt(y2, y3, 0x7632u);
                    float* ac = acc[2 * k + hh];
                    mma16816(ac, a0, a1, a2, a3, ph0, ph1);
                    mma16816(ac, a0, a1, a2, a3, pl0, pl1);
                }
            }
        }
    }
    gdc_launch_dependents();                        // main loop done: only the merge is left
    cp_wait<0>();
    syncthreads();                                  // every warp done with the ring
    // ---- merge the warps of the CTA through shared memory
    float* cm = (float*)ring;                       // [NW][8] max
    float* cl = cm + NW * 8;                        // [NW][8] denominators
    float* ca = cl + NW * 8;                        // [NW][8][TF_ACC_RS] accumulators
    constexpr int ARS = TF_ACC_RS;
    auto apos = [](int d) { return d + (d >> 5); };   // bank spread (TF_ACC_RS above)
    l_run += shfl_xor(l_run, 1);
    l_run += shfl_xor(l_run, 2);
    if (c == 0) { cm[w * 8 + g] = m_run; cl[w * 8 + g] = l_run; }
    for (int i = 0; i < KS; i++) {
        const int d0 = apos(vdim<VB>(i, 0, g)), d1 = apos(vdim<VB>(i, 1, g));
        float* a = ca + (i64)(w * 8 + 2 * c) * ARS;
        a[d0] = acc[i][0]; a[ARS + d0] = acc[i][1]; a[d1] = acc[i][2]; a[ARS + d1] = acc[i][3];
    }
    syncthreads();
    if (end > start) {
        for (int idx = tid; idx < GRP * HD; idx += NW * 32) {
            const int h = idx / HD, d = idx - h * HD;
            float M = TF_NEG_INF;
            for (int ww = 0; ww < NW; ww++) M = fmaxf(M, cm[ww * 8 + h]);
            float L = 0.f, O = 0.f;
            for (int ww = 0; ww < NW; ww++) {
                const float mw = cm[ww * 8 + h];
                if (mw != TF_NEG_INF) {
                    const float f = ex2(mw - M);
                    L += cl[ww * 8 + h] * f;
                    O += ca[(i64)(ww * 8 + h) * ARS + apos(d)] * f;
                }
            }
            const int head = kvh * GRP + h;
            if (split) {
                const i64 id = (i64)head * NCH + chunk;
                if (d == 0) { m_ws[id] = M; l_ws[id] = L; }
                acc_ws[id * HD + d] = O;
            } else {
                o[(i64)head * HD + d] = O / L;
            }
        }
    }
}

#ifndef TF_HOST
#ifdef MINB
extern "C" __global__ void __launch_bounds__(NW * 32, MINB)
#else
extern "C" __global__ void __launch_bounds__(NW * 32)
#endif
attn_q_kernel(const float* __restrict__ q_rot, const u8* __restrict__ kc,
              const u8* __restrict__ vc, const float* __restrict__ kcb,
              const float* __restrict__ vcb, float* o, float* m_ws, float* l_ws, float* acc_ws,
              const int* __restrict__ status, int Hkv, int GRP, int NCH, int CHUNK, int MINR,
              float qk_scale, int split) {
    TF_SMEM_DECL
    attn_q_body(q_rot, kc, vc, kcb, vcb, o, m_ws, l_ws, acc_ws, status, Hkv, GRP, NCH,
                (int)gridDim.x, CHUNK, MINR, qk_scale, split, tf_smem);
}
#endif

// shared memory bytes of one CTA (host side mirrors it in attn_decode_q_cuda.smem_bytes)
#define TF_SMEM_BYTES (HD * 32 + ((NW * NST * 16 * (TF_RS(KB, KG) + TF_RS(VB, VG))) > \
    (NW * (64 + 32 * TF_ACC_RS)) ? (NW * NST * 16 * (TF_RS(KB, KG) + TF_RS(VB, VG))) \
                                 : (NW * (64 + 32 * TF_ACC_RS))))

#endif  // TF_ATTN_Q_CUH
