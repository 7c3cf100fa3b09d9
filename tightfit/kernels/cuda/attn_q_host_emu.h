// Host (g++) stand-ins for the device primitives of attn_q.cuh: a SIMT emulator that runs the
// threads of one CTA as std::threads, with warp-collective operations (shuffles, mma.sync)
// exchanged through per-warp buffers between two barriers, cp.async done synchronously, and the
// fp16 conversions / packed fp16 arithmetic done bit-exactly in software (round to nearest even).
// Only for tests (tests/test_attn_decode_q_cuda.py): slow, but the same kernel body.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

typedef uint32_t u32;
typedef uint16_t u16;
typedef uint8_t u8;
typedef int64_t i64;
#define TF_DEV static inline
#define TF_NEG_INF (-INFINITY)

struct TfWarp {
    std::barrier<> bar{32};
    u32 xa[32][4];
    u32 xb[32][2];
    float xc[32][4];
    float xf[32];
};
struct TfCta {
    std::barrier<> bar;
    std::vector<TfWarp> warps;
    int bx, by;
    TfCta(int nthreads, int bx_, int by_) : bar(nthreads), warps(nthreads / 32), bx(bx_), by(by_) {}
};
static thread_local TfCta* tf_cta = nullptr;
static thread_local int tf_tid_v = 0;

TF_DEV int tf_tid() { return tf_tid_v; }
TF_DEV int tf_bx() { return tf_cta->bx; }
TF_DEV int tf_by() { return tf_cta->by; }
TF_DEV TfWarp& tf_warp() { return tf_cta->warps[tf_tid_v >> 5]; }

TF_DEV u32 prmt(u32 a, u32 b, u32 s) {
    u8 by[8];
    for (int i = 0; i < 4; i++) { by[i] = (a >> (8 * i)) & 255; by[4 + i] = (b >> (8 * i)) & 255; }
    u32 d = 0;
    for (int i = 0; i < 4; i++) {
        u32 n = (s >> (4 * i)) & 15;
        u32 v = by[n & 7];
        if (n & 8) v = (v & 0x80) ? 0xFF : 0x00;
        d |= v << (8 * i);
    }
    return d;
}
TF_DEV u32 f2h(float x) {                 // float -> fp16 bits, round to nearest even
    u32 f; std::memcpy(&f, &x, 4);
    u32 sign = (f >> 16) & 0x8000u;
    u32 a = f & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return sign | 0x7E00u;
    if (a >= 0x477FF000u) return sign | 0x7C00u;           // rounds to >= 65520 -> inf
    if (a < 0x38800000u) {                                  // subnormal half (or zero)
        float ax; std::memcpy(&ax, &a, 4);
        float r = std::nearbyint(ax * 16777216.0f);         // units of 2^-24, RNE
        return sign | (u32)r;
    }
    u32 mant = a & 0x7FFFFFu, exp = (a >> 23) - 127 + 15;
    u32 h = (exp << 10) | (mant >> 13);
    u32 rem = mant & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
    return sign | h;
}
TF_DEV float h2f(u32 h) {
    h &= 0xFFFFu;
    u32 sign = (h & 0x8000u) << 16, e = (h >> 10) & 31, m = h & 1023;
    float r;
    if (e == 0) r = std::ldexp((float)m, -24);
    else if (e == 31) r = m ? NAN : INFINITY;
    else r = std::ldexp((float)(m | 1024), (int)e - 25);
    u32 bits; std::memcpy(&bits, &r, 4); bits |= sign; std::memcpy(&r, &bits, 4);
    return r;
}
TF_DEV u32 f2h2(float lo, float hi) { return f2h(lo) | (f2h(hi) << 16); }
TF_DEV u32 hmul2(u32 a, u32 b) {   // fp16 products are exact in float: one rounding, like HMUL2
    return f2h(h2f(a) * h2f(b)) | (f2h(h2f(a >> 16) * h2f(b >> 16)) << 16);
}
TF_DEV u32 hadd2(u32 a, u32 b) {
    return f2h(h2f(a) + h2f(b)) | (f2h(h2f(a >> 16) + h2f(b >> 16)) << 16);
}
TF_DEV float ex2(float x) { return std::exp2(x); }
TF_DEV float fmaxf_(float a, float b) { return std::fmax(a, b); }
TF_DEV float shfl_xor(float v, int m) {
    TfWarp& w = tf_warp(); int l = tf_tid_v & 31;
    w.xf[l] = v; w.bar.arrive_and_wait();
    float r = w.xf[l ^ m]; w.bar.arrive_and_wait();
    return r;
}
TF_DEV float shfl_idx(float v, int src) {
    TfWarp& w = tf_warp(); int l = tf_tid_v & 31;
    w.xf[l] = v; w.bar.arrive_and_wait();
    float r = w.xf[src & 31]; w.bar.arrive_and_wait();
    return r;
}
TF_DEV bool warp_any(bool p) {
    TfWarp& w = tf_warp(); int l = tf_tid_v & 31;
    w.xf[l] = p ? 1.f : 0.f; w.bar.arrive_and_wait();
    bool r = false;
    for (int i = 0; i < 32; i++) r = r || w.xf[i] != 0.f;
    w.bar.arrive_and_wait();
    return r;
}
TF_DEV void syncwarp() { tf_warp().bar.arrive_and_wait(); }
TF_DEV void syncthreads() { tf_cta->bar.arrive_and_wait(); }
// mma.sync.m16n8k16 row.col f32 += f16 * f16, PTX fragment layouts (groupID = lane/4, tig = lane%4):
// A: r0 (g, 2t..2t+1), r1 (g+8, 2t..), r2 (g, 2t+8..), r3 (g+8, 2t+8..); B: r0 (k 2t..2t+1, n g),
// r1 (k 2t+8.., n g); C: c0, c1 (g, 2t..2t+1), c2, c3 (g+8, 2t..).
TF_DEV void mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    TfWarp& w = tf_warp(); int l = tf_tid_v & 31;
    w.xa[l][0] = a0; w.xa[l][1] = a1; w.xa[l][2] = a2; w.xa[l][3] = a3;
    w.xb[l][0] = b0; w.xb[l][1] = b1;
    w.bar.arrive_and_wait();
    float A[16][16], B[16][8];
    for (int ln = 0; ln < 32; ln++) {
        int g = ln >> 2, t = ln & 3;
        const u32* a = w.xa[ln];
        A[g][2 * t] = h2f(a[0]); A[g][2 * t + 1] = h2f(a[0] >> 16);
        A[g + 8][2 * t] = h2f(a[1]); A[g + 8][2 * t + 1] = h2f(a[1] >> 16);
        A[g][2 * t + 8] = h2f(a[2]); A[g][2 * t + 9] = h2f(a[2] >> 16);
        A[g + 8][2 * t + 8] = h2f(a[3]); A[g + 8][2 * t + 9] = h2f(a[3] >> 16);
        const u32* b = w.xb[ln];
        B[2 * t][g] = h2f(b[0]); B[2 * t + 1][g] = h2f(b[0] >> 16);
        B[2 * t + 8][g] = h2f(b[1]); B[2 * t + 9][g] = h2f(b[1] >> 16);
    }
    w.bar.arrive_and_wait();
    int g = l >> 2, t = l & 3;
    const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    for (int i = 0; i < 4; i++) {
        float s = c[i];
        for (int k = 0; k < 16; k++) s += A[rows[i]][k] * B[k][cols[i]];
        c[i] = s;
    }
}
TF_DEV void cp_async(void* dst, const void* src, int nbytes_valid) {
    std::memset(dst, 0, CPB);
    if (nbytes_valid) std::memcpy(dst, src, nbytes_valid);
}
TF_DEV void cp_commit() {}
TF_DEV u32 rotr(u32 x, u32 n) { n &= 31; return n ? (x >> n) | (x << (32 - n)) : x; }
TF_DEV u32 ld32(const u8* p) { u32 v; std::memcpy(&v, p, 4); return v; }
TF_DEV u32 ld16(const u8* p) { u16 v; std::memcpy(&v, p, 2); return v; }
TF_DEV void ld64(const u8* p, u32& a, u32& b) { a = ld32(p); b = ld32(p + 4); }
TF_DEV void ld128(const u8* p, u32* d) { for (int i = 0; i < 4; i++) d[i] = ld32(p + 4 * i); }
template <int N> TF_DEV void cp_wait() {}
