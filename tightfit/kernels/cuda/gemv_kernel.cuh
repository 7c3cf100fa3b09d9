// tightfit CUDA GEMV kernel: y[c, r] = sum_k x[c, k] * W[r, k], W in raw GGUF blocks (CONTRACT.md).
//
// Work split: a row of nb blocks is nb*PARTS (block, part) items. WPR warps share a row (WPR in
// 1, 2, 4, 8; 8/WPR rows per 256-thread CTA); warp `sub` of a row takes items sub*32 + lane,
// stepping 32*WPR, so the 32 lanes of a warp read 32 consecutive items = consecutive bytes
// (coalesced). Each step issues U items back to back (unrolled) so ~U*32*item_bytes are in flight
// per warp before the first dp4a needs them. Reduction: xor-butterfly inside the warp, then (WPR>1)
// through shared memory; lane 0 of the row's first warp writes y. One kernel, no split-K buffer.
#pragma once

#define TF_THREADS 256
#define TF_WARPS (TF_THREADS / 32)

// Items issued back to back per warp step: 4 for the 18-34-byte single-lane blocks at NC <= 2,
// else 2 (more columns = more registers per item; the x loads per item also grow with NC).
#ifndef TF_UNROLL32
#define TF_UNROLL32 4
#endif
template <class F, int NC>
struct tf_unroll { static constexpr int U = (F::QK == 32 && NC <= 2) ? TF_UNROLL32 : 2; };

// PDL (tightfit/kernels/pdl.py; TF_PDL / TF_PDL_PF from the launcher, gemv_common.cuh): every
// kernel below does only index math and tf_pf before tf_gdc_wait(), which every thread executes
// (rows >= n_out too), and signals tf_gdc_launch_dependents() after its main loop. The weights
// (which no kernel of the step writes) are read from the row start in steps: the row's warps
// together cover U*32/PARTS (v1 / v2 / v5) or U*G (v4) blocks times WPR per loop step, v3 one
// chunk (KC/QK blocks, whatever WPR). The row's first thread asks L2 for the row's first SB <<
// span_log2 blocks (SB = steps x blocks per step at WPR = 1) in one bulk prefetch (the 16-byte
// aligned part: the row may start mid-line; bytes missed are read as before). Without TF_PDL the
// call sites compile to nothing. Only the N = 1 kernels prefetch (tf_gemv5s excepted), the decode
// step's latency-bound case: elsewhere the extra code moved ptxas' allocation into spills (tf_gemv
// TQ1_0 / TQ2_0 at NC = 3, 4; tf_gemv5s Q5_K under its 64-register cap; tf_gemv3, below).
template <class F, int SB>
TF_DEV void tf_pf(const uint8_t* wr, unsigned nb, int wpr_log2, int span_log2) {
  constexpr uint64_t SPAN = (uint64_t)SB * F::BB;                 // bytes at span_log2 = 0
  if (threadIdx.x & ((32u << wpr_log2) - 1u)) return;            // thread 0 of the row's group
  const uint64_t span = SPAN << span_log2, rowb = (uint64_t)nb * F::BB;
  const uint64_t a = ((uint64_t)wr + 15) & ~(uint64_t)15;
  const uint64_t e = ((uint64_t)wr + (span < rowb ? span : rowb)) & ~(uint64_t)15;
  if (e > a) tf_prefetch_l2_bulk((const void*)a, (uint32_t)(e - a));
}

// Launch bounds give only the CTA size: with a min-CTAs argument (even 1) ptxas hoists every
// column's x loads and uses up to 255 registers; a cap of 64 at NC >= 4 spills on the K-quants.

template <class F, int NC>
__global__ void __launch_bounds__(TF_THREADS)
tf_gemv(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq, const float* __restrict__ xd,
        const int* __restrict__ xs16, float* __restrict__ y, int n_out, int K, int wpr_log2) {
  __shared__ float red[TF_WARPS][NC];
  constexpr int U = tf_unroll<F, NC>::U;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wpr = 1 << wpr_log2;
  const int sub = warp & (wpr - 1);
  const int row = blockIdx.x * (TF_WARPS >> wpr_log2) + (warp >> wpr_log2);
  const int nb = K / F::QK;
  const int items = nb * F::PARTS;
  float acc[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) acc[c] = 0.f;
  if (TF_PDL_PF > 0 && NC == 1 && row < n_out)   // NC >= 2: see tf_pf
    tf_pf<F, TF_PDL_PF * U * 32 / F::PARTS>(W + (uint64_t)row * nb * F::BB, nb, wpr_log2, wpr_log2);
  tf_gdc_wait();
  if (row < n_out) {
    const uint8_t* __restrict__ wr = W + (uint64_t)row * nb * F::BB;
    const int stride = 32 << wpr_log2;
    int i = sub * 32 + lane;
    for (; i + (U - 1) * stride < items; i += U * stride) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int it = i + u * stride;
        const int b = it / F::PARTS, p = it % F::PARTS;
        F::template dot<NC>(wr + (uint64_t)b * F::BB, p, xq + (uint64_t)b * F::QK, xd + b * (F::QK / 32),
                            xs16 + b * (F::QK / 16), K, acc);
      }
    }
    for (; i < items; i += stride) {
      const int b = i / F::PARTS, p = i % F::PARTS;
      F::template dot<NC>(wr + (uint64_t)b * F::BB, p, xq + (uint64_t)b * F::QK, xd + b * (F::QK / 32),
                          xs16 + b * (F::QK / 16), K, acc);
    }
  }
  tf_gdc_launch_dependents();
#pragma unroll
  for (int c = 0; c < NC; ++c) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[c] += __shfl_xor_sync(0xFFFFFFFFu, acc[c], o);
  }
  if (wpr_log2 == 0) {
    if (lane == 0 && row < n_out) {
#pragma unroll
      for (int c = 0; c < NC; ++c) y[(uint64_t)c * n_out + row] = acc[c];
    }
    return;
  }
  if (lane == 0) {
#pragma unroll
    for (int c = 0; c < NC; ++c) red[warp][c] = acc[c];
  }
  __syncthreads();
  if (sub == 0 && lane == 0 && row < n_out) {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      float s = red[warp][c];
      for (int j = 1; j < wpr; ++j) s += red[warp + j][c];
      y[(uint64_t)c * n_out + row] = s;
    }
  }
}

// NVRTC / nvcc instantiation list: tf_gemv<F_xxx, NC>, NC in 1..8 and 16 (gemv_cuda.py builds the
// names from the TF_*_FORMATS lists).

// ---------------------------------------------------------------- v2 (gemv_cuda kern "v2", default)
// Same work split and reduction as tf_gemv. Differences: (1) the loop runs over blocks with the part
// fixed per lane (32*WPR is a multiple of PARTS, so part = lane % PARTS never changes; no signed
// division per item); (2) formats with a two-phase interface (struct Raw, load(), compute<NC>())
// get the raw loads of all U items issued before the first compute (ptxas otherwise interleaves
// them with the decode of the previous item, leaving ~1 item of weights in flight per lane), and
// U = 4 at NC <= 2 for them.
// tf_has_raw: the format has the load()/compute() split (struct Raw). v2 uses it for IQ4_XS and
// Q5_K only (tf_two_phase; Q8_0 / Q4_K / Q6_K got a Raw for v3 and keep v2's dot path).
template <class F, class = void> struct tf_has_raw { static constexpr bool value = false; };
template <class F> struct tf_has_raw<F, decltype((void)sizeof(typename F::Raw))> {
  static constexpr bool value = true;
};
template <class F> struct tf_two_phase { static constexpr bool value = false; };
template <> struct tf_two_phase<F_IQ4_XS> { static constexpr bool value = tf_has_raw<F_IQ4_XS>::value; };
template <> struct tf_two_phase<F_Q5_K> { static constexpr bool value = tf_has_raw<F_Q5_K>::value; };
// tf_has_c1: the format has a single-column compute1(Raw, part, xq, xd, xs16, K, float& acc) with a
// decode that pays off only at one column (IQ4_XS: two lookups + permuted x instead of select +
// interleave). tf_gemv4 calls it at NC = 1 (tf_compute2); v3 keeps compute<1> (its decode is shared
// by the columns and rows of a warp).
template <class F, class = void> struct tf_has_c1 { static constexpr bool value = false; };
template <class F>
struct tf_has_c1<F, decltype((void)&F::compute1)> { static constexpr bool value = true; };
template <class F, int NC>
TF_DEV void tf_compute2(const typename F::Raw& r, int p, const int8_t* __restrict__ xq,
                        const float* __restrict__ xd, const int* __restrict__ xs16, int K,
                        float (&acc)[NC]) {
  if constexpr (NC == 1 && tf_has_c1<F>::value) F::compute1(r, p, xq, xd, xs16, K, acc[0]);
  else F::template compute<NC>(r, p, xq, xd, xs16, K, acc);
}
// tf_has_l1: the format has load1(blk, part, Raw&), the load its compute1 expects (F_Q6_K: global
// funnel-shift loads, sign-extended scales); tf_load1 falls back to load. Every caller of compute1
// loads through tf_load1.
template <class F, class = void> struct tf_has_l1 { static constexpr bool value = false; };
template <class F>
struct tf_has_l1<F, decltype((void)&F::load1)> { static constexpr bool value = true; };
template <class F>
TF_DEV void tf_load1(const uint8_t* __restrict__ blk, int p, typename F::Raw& r) {
  if constexpr (tf_has_l1<F>::value) F::load1(blk, p, r);
  else F::load(blk, p, r);
}
template <class F, int NC>
struct tf_unroll2 {
  static constexpr int U = tf_two_phase<F>::value ? (NC <= 2 ? 4 : 2) : tf_unroll<F, NC>::U;
};

// Body of the v2 kernels. tf_gemv2 (NC >= 3) has the same launch bounds as tf_gemv; tf_gemv2h
// (gemv_cuda kern "v2h" uses it for NC = 1) adds min 4 CTAs/SM (<= 64 registers): with it ptxas keeps the
// U items' loads hoisted ahead of the decode instead of sinking them to save registers.
template <class F, int NC>
TF_DEV void tf_gemv2_body(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq,
                          const float* __restrict__ xd, const int* __restrict__ xs16,
                          float* __restrict__ y, int n_out, int K, int wpr_log2, float (*red)[NC]) {
  constexpr int U = tf_unroll2<F, NC>::U;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wpr = 1 << wpr_log2;
  const int sub = warp & (wpr - 1);
  const int row = blockIdx.x * (TF_WARPS >> wpr_log2) + (warp >> wpr_log2);
  const unsigned nb = (unsigned)K / F::QK;
  float acc[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) acc[c] = 0.f;
  if (TF_PDL_PF > 0 && NC == 1 && row < n_out)   // NC >= 2: see tf_pf
    tf_pf<F, TF_PDL_PF * U * 32 / F::PARTS>(W + (uint64_t)row * nb * F::BB, nb, wpr_log2, wpr_log2);
  tf_gdc_wait();
  if (row < n_out) {
    const uint8_t* __restrict__ wr = W + (uint64_t)row * nb * F::BB;
    const int p = lane % F::PARTS;
    const unsigned bstep = (32u << wpr_log2) / F::PARTS;
    unsigned b = ((unsigned)sub * 32u + (unsigned)lane) / F::PARTS;
    for (; b + (U - 1) * bstep < nb; b += U * bstep) {
      if constexpr (tf_two_phase<F>::value) {
        typename F::Raw r[U];
#pragma unroll
        for (int u = 0; u < U; ++u) F::load(wr + (uint64_t)(b + u * bstep) * F::BB, p, r[u]);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const unsigned bu = b + u * bstep;
          F::template compute<NC>(r[u], p, xq + (uint64_t)bu * F::QK, xd + bu * (F::QK / 32),
                                  xs16 + bu * (F::QK / 16), K, acc);
        }
      } else {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const unsigned bu = b + u * bstep;
          F::template dot<NC>(wr + (uint64_t)bu * F::BB, p, xq + (uint64_t)bu * F::QK,
                              xd + bu * (F::QK / 32), xs16 + bu * (F::QK / 16), K, acc);
        }
      }
    }
    for (; b < nb; b += bstep) {
      F::template dot<NC>(wr + (uint64_t)b * F::BB, p, xq + (uint64_t)b * F::QK, xd + b * (F::QK / 32),
                          xs16 + b * (F::QK / 16), K, acc);
    }
  }
  tf_gdc_launch_dependents();
#pragma unroll
  for (int c = 0; c < NC; ++c) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[c] += __shfl_xor_sync(0xFFFFFFFFu, acc[c], o);
  }
  if (wpr_log2 == 0) {
    if (lane == 0 && row < n_out) {
#pragma unroll
      for (int c = 0; c < NC; ++c) y[(uint64_t)c * n_out + row] = acc[c];
    }
    return;
  }
  if (lane == 0) {
#pragma unroll
    for (int c = 0; c < NC; ++c) red[warp][c] = acc[c];
  }
  __syncthreads();
  if (sub == 0 && lane == 0 && row < n_out) {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      float s = red[warp][c];
      for (int j = 1; j < wpr; ++j) s += red[warp + j][c];
      y[(uint64_t)c * n_out + row] = s;
    }
  }
}

template <class F, int NC>
__global__ void __launch_bounds__(TF_THREADS)
tf_gemv2(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq, const float* __restrict__ xd,
         const int* __restrict__ xs16, float* __restrict__ y, int n_out, int K, int wpr_log2) {
  __shared__ float red[TF_WARPS][NC];
  tf_gemv2_body<F, NC>(W, xq, xd, xs16, y, n_out, K, wpr_log2, red);
}

template <class F, int NC>
__global__ void __launch_bounds__(TF_THREADS, 4)
tf_gemv2h(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq, const float* __restrict__ xd,
          const int* __restrict__ xs16, float* __restrict__ y, int n_out, int K, int wpr_log2) {
  __shared__ float red[TF_WARPS][NC];
  tf_gemv2_body<F, NC>(W, xq, xd, xs16, y, n_out, K, wpr_log2, red);
}

// ---------------------------------------------------------------- v5 (gemv_cuda kern "v5", NC = 1)
// tf_gemv2h's item-to-lane mapping and leftover loop (lane -> block b = (sub*32 + lane)/PARTS + u*bstep,
// bstep = 32*WPR/PARTS, part lane % PARTS; steps of U*bstep blocks, then the leftover blocks one per
// lane at stride bstep), with
// (1) the format's single-column compute1 for every item (tf_load1 + compute1, two-phase, U = 4);
// (2) WPR a compile-time constant (one body per wpr_log2, picked by a uniform switch), so the U items
//     of a step sit at constant offsets u*bstep blocks from four per-lane pointers: the loads take
//     [reg + imm] addresses and a step costs one pointer bump per array (what made tf_gemv4 cheap),
//     while each warp-wide load still covers the same blocks as tf_gemv2h's.
// Callers keep xd and xs16 8-byte aligned (compute1's pair loads). Two instantiations below: tf_gemv5
// (U = 4, <= 80 registers) and tf_gemv5s (U = 2, <= 64 registers as tf_gemv2h).
template <class F, int NC, int WL, int U>
TF_DEV void tf_gemv5_body(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq,
                          const float* __restrict__ xd, const int* __restrict__ xs16,
                          float* __restrict__ y, int n_out, int K, float (*red)[NC]) {
  constexpr unsigned WPR = 1u << WL, BSTEP = (32u << WL) / F::PARTS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = warp & (WPR - 1);
  const int row = blockIdx.x * (TF_WARPS >> WL) + (warp >> WL);
  const unsigned nb = (unsigned)K / F::QK;
  float acc[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) acc[c] = 0.f;
  if (TF_PDL_PF > 0 && U >= 4 && row < n_out)   // not tf_gemv5s: see tf_pf
    tf_pf<F, TF_PDL_PF * U * 32 / F::PARTS>(W + (uint64_t)row * nb * F::BB, nb, WL, WL);
  tf_gdc_wait();
  if (row < n_out) {
    const int p = lane % F::PARTS;
    unsigned b = ((unsigned)sub * 32u + (unsigned)lane) / F::PARTS;
    const uint8_t* wp = W + ((uint64_t)row * nb + b) * F::BB;
    const int8_t* xp = xq + (uint64_t)b * F::QK;
    const float* dp = xd + b * (F::QK / 32);
    const int* sp = xs16 + b * (F::QK / 16);
    for (; b + (U - 1) * BSTEP < nb; b += U * BSTEP) {
      typename F::Raw r[U];
#pragma unroll
      for (int u = 0; u < U; ++u) tf_load1<F>(wp + u * BSTEP * F::BB, p, r[u]);
#pragma unroll
      for (int u = 0; u < U; ++u)
        tf_compute2<F, NC>(r[u], p, xp + u * BSTEP * F::QK, dp + u * BSTEP * (F::QK / 32),
                           sp + u * BSTEP * (F::QK / 16), K, acc);
      wp += U * BSTEP * F::BB; xp += U * BSTEP * F::QK;
      dp += U * BSTEP * (F::QK / 32); sp += U * BSTEP * (F::QK / 16);
    }
    for (; b < nb; b += BSTEP) {
      typename F::Raw r;
      tf_load1<F>(wp, p, r);
      tf_compute2<F, NC>(r, p, xp, dp, sp, K, acc);
      wp += BSTEP * F::BB; xp += BSTEP * F::QK; dp += BSTEP * (F::QK / 32); sp += BSTEP * (F::QK / 16);
    }
  }
  tf_gdc_launch_dependents();
#pragma unroll
  for (int c = 0; c < NC; ++c) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[c] += __shfl_xor_sync(0xFFFFFFFFu, acc[c], o);
  }
  if (WL == 0) {
    if (lane == 0 && row < n_out) {
#pragma unroll
      for (int c = 0; c < NC; ++c) y[(uint64_t)c * n_out + row] = acc[c];
    }
    return;
  }
  if (lane == 0) {
#pragma unroll
    for (int c = 0; c < NC; ++c) red[warp][c] = acc[c];
  }
  __syncthreads();
  if (sub == 0 && lane == 0 && row < n_out) {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      float s = red[warp][c];
#pragma unroll
      for (unsigned j = 1; j < WPR; ++j) s += red[warp + j][c];
      y[(uint64_t)c * n_out + row] = s;
    }
  }
}

template <class F, int NC, int U>
TF_DEV void tf_gemv5_switch(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq,
                            const float* __restrict__ xd, const int* __restrict__ xs16,
                            float* __restrict__ y, int n_out, int K, int wpr_log2, float (*red)[NC]) {
  switch (wpr_log2) {     // uniform over the grid
    case 0: tf_gemv5_body<F, NC, 0, U>(W, xq, xd, xs16, y, n_out, K, red); break;
    case 1: tf_gemv5_body<F, NC, 1, U>(W, xq, xd, xs16, y, n_out, K, red); break;
    case 2: tf_gemv5_body<F, NC, 2, U>(W, xq, xd, xs16, y, n_out, K, red); break;
    default: tf_gemv5_body<F, NC, 3, U>(W, xq, xd, xs16, y, n_out, K, red); break;
  }
}

// kern "v5": U = 4 with min 3 CTAs/SM (<= 80 registers): at 64 registers ptxas spills the four
// items' hoisted raw words (Q5_K: 208 bytes) instead of sinking them.
template <class F, int NC>
__global__ void __launch_bounds__(TF_THREADS, 3)
tf_gemv5(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq, const float* __restrict__ xd,
         const int* __restrict__ xs16, float* __restrict__ y, int n_out, int K, int wpr_log2) {
  __shared__ float red[TF_WARPS][NC];
  tf_gemv5_switch<F, NC, 4>(W, xq, xd, xs16, y, n_out, K, wpr_log2, red);
}

// kern "v5s": U = 2 with tf_gemv2h's min 4 CTAs/SM (<= 64 registers, no spills): fewer bytes in
// flight per warp, more warps.
template <class F, int NC>
__global__ void __launch_bounds__(TF_THREADS, 4)
tf_gemv5s(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq, const float* __restrict__ xd,
          const int* __restrict__ xs16, float* __restrict__ y, int n_out, int K, int wpr_log2) {
  __shared__ float red[TF_WARPS][NC];
  tf_gemv5_switch<F, NC, 2>(W, xq, xd, xs16, y, n_out, K, wpr_log2, red);
}

// ---------------------------------------------------------------- v4 (gemv_cuda kern "v4", NC = 1)
// tf_gemv2h for the two-phase formats with two changes that cut instructions per item (N = 1 is
// issue-bound, mostly on the integer ALU pipe):
// (1) compute1 where the format has one (tf_compute2: IQ4_XS's sign-select lookup, see
//     tf_iq4_dot1);
// (2) constant offsets between a lane's U items: warp sub owns span = U*G consecutive blocks per
//     step (G = 32/PARTS blocks per warp-wide item; lane -> block lane/PARTS, part lane%PARTS), so
//     item u sits at a compile-time offset u*G blocks from the lane's pointers: the loads take
//     [reg + imm] addresses and a step costs one pointer bump per array instead of ~3 address
//     instructions per item and array. Each load instruction still reads G consecutive blocks
//     across the warp (coalesced as in v2). The row's wpr warps take interleaved spans (stride
//     span*wpr); blocks past the last full stride (< span*wpr) are split as in v2 (block
//     base + sub*G + lane/PARTS + u*G*wpr, at most U per lane), loaded together, then computed.
template <class F, int NC>
__global__ void __launch_bounds__(TF_THREADS, 4)
tf_gemv4(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq, const float* __restrict__ xd,
         const int* __restrict__ xs16, float* __restrict__ y, int n_out, int K, int wpr_log2) {
  __shared__ float red[TF_WARPS][NC];
  constexpr int U = tf_unroll2<F, NC>::U;
  constexpr unsigned G = 32u / F::PARTS, SPAN = U * G;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wpr = 1 << wpr_log2;
  const int sub = warp & (wpr - 1);
  const int row = blockIdx.x * (TF_WARPS >> wpr_log2) + (warp >> wpr_log2);
  const unsigned nb = (unsigned)K / F::QK;
  float acc[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) acc[c] = 0.f;
  if (TF_PDL_PF > 0 && row < n_out)
    tf_pf<F, TF_PDL_PF * SPAN>(W + (uint64_t)row * nb * F::BB, nb, wpr_log2, wpr_log2);
  tf_gdc_wait();
  if (row < n_out) {
    const uint8_t* __restrict__ wr = W + (uint64_t)row * nb * F::BB;
    const int p = lane % F::PARTS;
    const unsigned lb = (unsigned)lane / F::PARTS;
    const unsigned sstep = SPAN << wpr_log2;            // blocks per step of the row's warps
    const unsigned nfull = nb / sstep;
    unsigned b = (unsigned)sub * SPAN + lb;
    const uint8_t* wp = wr + (uint64_t)b * F::BB;
    const int8_t* xp = xq + (uint64_t)b * F::QK;
    const float* dp = xd + b * (F::QK / 32);
    const int* sp = xs16 + b * (F::QK / 16);
    for (unsigned s = 0; s < nfull; ++s) {
      typename F::Raw r[U];
#pragma unroll
      for (int u = 0; u < U; ++u) tf_load1<F>(wp + u * G * F::BB, p, r[u]);
#pragma unroll
      for (int u = 0; u < U; ++u)
        tf_compute2<F, NC>(r[u], p, xp + u * G * F::QK, dp + u * G * (F::QK / 32),
                           sp + u * G * (F::QK / 16), K, acc);
      wp += (uint64_t)sstep * F::BB;
      xp += (uint64_t)sstep * F::QK;
      dp += sstep * (F::QK / 32);
      sp += sstep * (F::QK / 16);
    }
    // remainder (< sstep blocks): at most U items per lane
    const unsigned b0 = nfull * sstep + (unsigned)sub * G + lb, bs = G << wpr_log2;
    if (b0 < nb) {
      typename F::Raw r[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (b0 + u * bs < nb) tf_load1<F>(wr + (uint64_t)(b0 + u * bs) * F::BB, p, r[u]);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const unsigned bu = b0 + u * bs;
        if (bu < nb)
          tf_compute2<F, NC>(r[u], p, xq + (uint64_t)bu * F::QK, xd + bu * (F::QK / 32),
                             xs16 + bu * (F::QK / 16), K, acc);
      }
    }
  }
  tf_gdc_launch_dependents();
#pragma unroll
  for (int c = 0; c < NC; ++c) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[c] += __shfl_xor_sync(0xFFFFFFFFu, acc[c], o);
  }
  if (wpr_log2 == 0) {
    if (lane == 0 && row < n_out) {
#pragma unroll
      for (int c = 0; c < NC; ++c) y[(uint64_t)c * n_out + row] = acc[c];
    }
    return;
  }
  if (lane == 0) {
#pragma unroll
    for (int c = 0; c < NC; ++c) red[warp][c] = acc[c];
  }
  __syncthreads();
  if (sub == 0 && lane == 0 && row < n_out) {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      float s = red[warp][c];
      for (int j = 1; j < wpr; ++j) s += red[warp + j][c];
      y[(uint64_t)c * n_out + row] = s;
    }
  }
}

// ---------------------------------------------------------------- v3 (gemv_cuda kern "v3", NC >= 2)
// x staged in shared memory per CTA. All rows of a CTA multiply the same x, so the CTA copies a
// K-chunk of KC elements of all NC columns (int8 q, fp32 per-32 scales d, int32 per-16 sums s16)
// into shared memory once (cp.async, double-buffered: chunk j+1 is in flight while chunk j is
// computed) and the warps run the format's dot against the staged copy. Staged layout per buffer:
// q[NC][KC] | d[NC][KC/32] | s16[NC][KC/16]; dot gets pointers into it and KC as its `K` argument,
// which is exactly CONTRACT.md's column stride (xq + c*K, xd + c*(K/32), xs16 + c*(K/16)).
// s16 is not staged for formats that never read xs16 (tf_v3_s16 below).
//
// Work split: a warp owns RPW rows (acc[RPW][NC]); WPR warps share a row group (KC/1024 >= WPR:
// warp sub takes the chunk's items sub*32 + lane + u*32*WPR). Every item (block b, part p) of a
// chunk is computed for the RPW rows back to back with the same x pointers, so after inlining the
// x (shared) loads of rows 1.. are the same addresses as row 0's and can be reused (GVN). Weight
// stream: the 32 lanes of a warp still read 32 consecutive items of one row (coalesced as v1);
// U = RPW * KC/(1024*WPR) items per lane are in flight per chunk. Rows per CTA = 8/WPR * RPW.
// Chunks: K = nchunks*KC + tail; the tail chunk (kc = K - k0 < KC, a multiple of QK) stages and
// computes only its kc elements (item bound kc/32); every thread takes part in every barrier.
// KC >= 1024 keeps every lane busy (QK/PARTS = 32 weights per item for every format).
template <int NC> struct tf_v3_geom {
  static constexpr int KC = NC <= 8 ? 2048 : 1024;   // elements per chunk
  static constexpr int RPW = NC <= 8 ? 2 : 1;        // rows per warp (gemv_cuda.v3_rpw mirrors)
};
template <class F> struct tf_v3_s16 { static constexpr bool value = true; };
template <> struct tf_v3_s16<F_Q8_0> { static constexpr bool value = false; };
template <> struct tf_v3_s16<F_IQ4_NL> { static constexpr bool value = false; };
template <> struct tf_v3_s16<F_IQ4_XS> { static constexpr bool value = false; };

template <int NC, bool S16, int KC>
struct tf_v3_smem {
  static constexpr int Q = NC * KC, D = NC * (KC / 32) * 4, S = S16 ? NC * (KC / 16) * 4 : 0;
  static constexpr int BYTES = Q + D + S;   // multiple of 16 (KC multiple of 256)
};

TF_DEV uint32_t tf_smem_addr(const void* p) {
  uint32_t a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}
TF_DEV void tf_cp16(void* s, const void* g) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(tf_smem_addr(s)), "l"(g) : "memory");
}
TF_DEV void tf_cp4(void* s, const void* g) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(tf_smem_addr(s)), "l"(g) : "memory");
}
TF_DEV void tf_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> TF_DEV void tf_cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// Issue the copies of chunk [k0, k0 + kc) of NC columns into buffer `buf` (one commit group).
template <int NC, bool S16, int KC>
TF_DEV void tf_v3_stage(uint8_t* buf, const int8_t* __restrict__ xq, const float* __restrict__ xd,
                        const int* __restrict__ xs16, int K, int k0, int kc) {
  typedef tf_v3_smem<NC, S16, KC> L;
  const int t = threadIdx.x;
  const int nq = kc >> 4;                    // 16-byte pieces per column (kc multiple of 32)
  for (int i = t; i < NC * nq; i += TF_THREADS) {
    const int c = i / nq, j = i - c * nq;
    tf_cp16(buf + c * KC + 16 * j, xq + (uint64_t)c * K + k0 + 16 * j);
  }
  const int nd = kc >> 5, K32 = K >> 5;
  float* sd = (float*)(buf + L::Q);
  for (int i = t; i < NC * nd; i += TF_THREADS) {
    const int c = i / nd, j = i - c * nd;
    tf_cp4(sd + c * (KC / 32) + j, xd + (uint64_t)c * K32 + (k0 >> 5) + j);
  }
  if (S16) {
    const int ns = kc >> 4, K16 = K >> 4;
    int* ss = (int*)(buf + L::Q + L::D);
    for (int i = t; i < NC * ns; i += TF_THREADS) {
      const int c = i / ns, j = i - c * ns;
      tf_cp4(ss + c * (KC / 16) + j, xs16 + (uint64_t)c * K16 + (k0 >> 4) + j);
    }
  }
  tf_cp_commit();
}

template <class F, int NC>
__global__ void __launch_bounds__(TF_THREADS)
tf_gemv3(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq, const float* __restrict__ xd,
         const int* __restrict__ xs16, float* __restrict__ y, int n_out, int K, int wpr_log2) {
  constexpr int KC = tf_v3_geom<NC>::KC, RPW = tf_v3_geom<NC>::RPW;
  constexpr bool S16 = tf_v3_s16<F>::value;
  typedef tf_v3_smem<NC, S16, KC> L;
  constexpr int UMAX = KC / 1024;            // items per lane per row per chunk at WPR = 1
  __shared__ __align__(16) uint8_t xs[2][L::BYTES];
  __shared__ float red[TF_WARPS][RPW][NC];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wpr = 1 << wpr_log2;
  const int sub = warp & (wpr - 1);
  const int row0 = (blockIdx.x * (TF_WARPS >> wpr_log2) + (warp >> wpr_log2)) * RPW;
  const unsigned nb = (unsigned)K / F::QK;
  const int p = lane % F::PARTS;
  const uint8_t* wr[RPW];
  bool live[RPW];
#pragma unroll
  for (int r = 0; r < RPW; ++r) {   // rows past n_out compute on row 0's weights, never stored
    live[r] = row0 + r < n_out;
    wr[r] = W + (uint64_t)(live[r] ? row0 + r : 0) * nb * F::BB;
  }
  float acc[RPW][NC];
#pragma unroll
  for (int r = 0; r < RPW; ++r)
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[r][c] = 0.f;

  // The prefetch moves ptxas' allocation of these kernels by up to +30 registers / 16 B of spills
  // (Q5_K, Q6_K), so v3 prefetches only when asked (TF_PDL_PF_V3, TIGHTFIT_PDL_PF_V3); the wait
  // alone leaves them unchanged. Rows past n_out take the last row (no branch); pr is kept
  // opaque so the main loop does not reuse (and keep live) the prefetch's address math.
  if constexpr (TF_PDL_PF_V3 > 0) {
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const uint8_t* pr = W + (uint64_t)(row0 + r < n_out ? row0 + r : n_out - 1) * nb * F::BB;
      asm("" : "+l"(pr));
      tf_pf<F, KC / F::QK * TF_PDL_PF_V3>(pr, nb, wpr_log2, 0);
    }
  }
  tf_gdc_wait();     // before the first x copy
  const int nchunks = (K + KC - 1) / KC;
  tf_v3_stage<NC, S16, KC>(xs[0], xq, xd, xs16, K, 0, K < KC ? K : KC);
  for (int j = 0; j < nchunks; ++j) {
    const int k0 = j * KC;
    if (j + 1 < nchunks) {
      const int k1 = k0 + KC;
      tf_v3_stage<NC, S16, KC>(xs[(j + 1) & 1], xq, xd, xs16, K, k1, K - k1 < KC ? K - k1 : KC);
      tf_cp_wait<1>();
    } else {
      tf_cp_wait<0>();
    }
    __syncthreads();
    const uint8_t* buf = xs[j & 1];
    const int8_t* sq = (const int8_t*)buf;
    const float* sd = (const float*)(buf + L::Q);
    const int* ss = (const int*)(buf + L::Q + L::D);
    const int nit = (K - k0 < KC ? K - k0 : KC) >> 5;      // items per row in this chunk
    const unsigned bc0 = (unsigned)k0 / F::QK;             // first block of the chunk
    if constexpr (tf_has_raw<F>::value) {
      // all items' weights first (UMAX * RPW loads in flight per lane), then column by column:
      // compute<1> of every row on the same column pointers -> the column's x words are loaded
      // once (adjacent identical shared loads, CSE'd) and used for the RPW rows; the weight decode
      // is the same pure arithmetic for every column (CSE'd across columns).
      typename F::Raw raw[UMAX][RPW];
      int bu[UMAX];
#pragma unroll
      for (int u = 0; u < UMAX; ++u) {
        const int it = sub * 32 + lane + u * 32 * wpr;
        bu[u] = (it < nit ? it : nit - 1) / F::PARTS;      // clamped: loads stay inside the row
#pragma unroll
        for (int r = 0; r < RPW; ++r) F::load(wr[r] + (uint64_t)(bc0 + bu[u]) * F::BB, p, raw[u][r]);
      }
#pragma unroll
      for (int u = 0; u < UMAX; ++u) {
        if (sub * 32 + lane + u * 32 * wpr < nit) {
          const int8_t* q = sq + bu[u] * F::QK;
          const float* d = sd + bu[u] * (F::QK / 32);
          const int* s = ss + bu[u] * (F::QK / 16);
#pragma unroll
          for (int c = 0; c < NC; ++c) {
#pragma unroll
            for (int r = 0; r < RPW; ++r) {
              float a1[1] = {acc[r][c]};
              F::template compute<1>(raw[u][r], p, q + c * KC, d + c * (KC / 32), s + c * (KC / 16),
                                     KC, a1);
              acc[r][c] = a1[0];
            }
          }
        }
      }
    } else {
#pragma unroll
      for (int u = 0; u < UMAX; ++u) {
        const int it = sub * 32 + lane + u * 32 * wpr;
        if (it < nit) {
          const int b = it / F::PARTS;                     // block within the chunk
          const int8_t* q = sq + b * F::QK;
          const float* d = sd + b * (F::QK / 32);
          const int* s = ss + b * (F::QK / 16);
#pragma unroll
          for (int r = 0; r < RPW; ++r)
            F::template dot<NC>(wr[r] + (uint64_t)(bc0 + b) * F::BB, p, q, d, s, KC, acc[r]);
        }
      }
    }
    __syncthreads();     // buffer j & 1 is restaged in iteration j + 1
  }
  tf_gdc_launch_dependents();

#pragma unroll
  for (int r = 0; r < RPW; ++r)
#pragma unroll
    for (int c = 0; c < NC; ++c) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[r][c] += __shfl_xor_sync(0xFFFFFFFFu, acc[r][c], o);
    }
  if (wpr_log2 == 0) {
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < RPW; ++r)
        if (live[r]) {
#pragma unroll
          for (int c = 0; c < NC; ++c) y[(uint64_t)c * n_out + row0 + r] = acc[r][c];
        }
    }
    return;
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < RPW; ++r)
#pragma unroll
      for (int c = 0; c < NC; ++c) red[warp][r][c] = acc[r][c];
  }
  __syncthreads();
  if (sub == 0 && lane == 0) {
#pragma unroll
    for (int r = 0; r < RPW; ++r)
      if (live[r]) {
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          float s = red[warp][r][c];
          for (int w = 1; w < wpr; ++w) s += red[warp + w][r][c];
          y[(uint64_t)c * n_out + row0 + r] = s;
        }
      }
  }
}
