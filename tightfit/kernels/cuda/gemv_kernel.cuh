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
template <class F, class = void> struct tf_two_phase { static constexpr bool value = false; };
template <class F> struct tf_two_phase<F, decltype((void)sizeof(typename F::Raw))> {
  static constexpr bool value = true;
};
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
