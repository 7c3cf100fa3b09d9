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
