// tightfit CUDA GEMV, weights staged through shared memory by the bulk-copy engine (sm_90, "tma").
//
// Why: Nsight Compute (bench/RESULTS.md, session 5 call 1) shows the register-fed kernels of
// gemv_kernel.cuh latency-bound: ~7 warps per scheduler, each with about one item of weights in
// flight, DRAM ~55 % busy and long-scoreboard stalls half of all cycles. Here each warp owns one
// row and keeps S chunks of it in flight through cp.async.bulk (no registers held by loads in
// flight), then runs the unchanged format code F::dot on the staged bytes. With PDL (TF_TMA_PDL)
// the first S chunks are requested before griddepcontrol.wait: weights are immutable in the
// step, so they stream while the previous kernel finishes.
//
// Chunk: CB blocks (CB * PARTS a multiple of 32, so every lane owns whole items). A chunk's bytes
// are copied from the 16-byte-aligned address at or below its start (the bulk copy's alignment
// rule), so a block keeps its global alignment modulo 16 inside the stage (the formats rely on
// TF_BLK_ALIGN). The up-to-15 bytes past a chunk's end that rounding adds are read only when they
// stay inside the matrix; the last chunk of the last row copies its tail with plain loads.
#pragma once

#define TF_TMA_THREADS 256
#define TF_TMA_WARPS 8
#ifndef TF_TMA_STAGES
#define TF_TMA_STAGES 3
#endif
#ifndef TF_TMA_CHUNK_BYTES
#define TF_TMA_CHUNK_BYTES 1536
#endif

template <class F> struct tf_tma_geom {
  static constexpr int MINB = 32 / F::PARTS;                       // blocks per 32 items
  static constexpr int CB0 = TF_TMA_CHUNK_BYTES / F::BB / MINB * MINB;
  static constexpr int CB = CB0 > 0 ? CB0 : MINB;                  // blocks per chunk
  static constexpr int STAGE = (CB * F::BB + 16 + 15) / 16 * 16;  // bytes per stage (+ slack)
};

__device__ __forceinline__ uint32_t tf_smem_u32(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void tf_mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  }
}

// Lane 0 only: stage chunk `c` of the row (blocks c*CB .. min(nb, (c+1)*CB)) into `dst`.
// Returns nothing; the bytes are in `dst + (src & 15)` once the stage's barrier completes.
template <class F>
__device__ __forceinline__ void tf_tma_issue(const uint8_t* __restrict__ wr, int nb, int c,
                                             uint8_t* dst, uint32_t bar, uint64_t mat_end) {
  using G = tf_tma_geom<F>;
  const int b0 = c * G::CB;
  const int nblk = min(G::CB, nb - b0);
  const uint64_t src = (uint64_t)(wr + (uint64_t)b0 * F::BB);
  const uint64_t a = src & ~(uint64_t)15;
  uint64_t end = (src + (uint64_t)nblk * F::BB + 15) & ~(uint64_t)15;
  if (end > mat_end) end = mat_end & ~(uint64_t)15;                // tail copied by the lanes
  const uint32_t size = (uint32_t)(end - a);
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(size)
               : "memory");
  if (size > 0) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(tf_smem_u32(dst)), "l"(a), "r"(size), "r"(bar) : "memory");
  }
}

template <class F, int NC>
__global__ void __launch_bounds__(TF_TMA_THREADS)
tf_gemv_tma(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq, const float* __restrict__ xd,
            const int* __restrict__ xs16, float* __restrict__ y, int n_out, int K, int unused) {
  using G = tf_tma_geom<F>;
  extern __shared__ __align__(16) uint8_t tf_tma_smem[];
  __shared__ __align__(8) uint64_t bars[TF_TMA_WARPS][TF_TMA_STAGES];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row = blockIdx.x * TF_TMA_WARPS + warp;
  const bool active = row < n_out;
  const int nb = K / F::QK;
  const int nch = (nb + G::CB - 1) / G::CB;
  const uint8_t* __restrict__ wr = W + (uint64_t)(active ? row : 0) * nb * F::BB;
  const uint64_t mat_end = (uint64_t)(W + (uint64_t)n_out * nb * F::BB);
  uint8_t* stage0 = tf_tma_smem + (size_t)warp * TF_TMA_STAGES * G::STAGE;
  if (lane == 0) {
#pragma unroll
    for (int s = 0; s < TF_TMA_STAGES; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(tf_smem_u32(&bars[warp][s])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    if (active) {
      for (int s = 0; s < TF_TMA_STAGES && s < nch; ++s)
        tf_tma_issue<F>(wr, nb, s, stage0 + s * G::STAGE, tf_smem_u32(&bars[warp][s]), mat_end);
    }
  }
#if defined(TF_TMA_PDL)
  asm volatile("griddepcontrol.wait;" ::: "memory");               // x is written by the previous kernel
#endif
  __syncwarp();
  float acc[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) acc[c] = 0.f;
  if (active) {
    for (int ch = 0; ch < nch; ++ch) {
      const int s = ch % TF_TMA_STAGES;
      uint8_t* st = stage0 + s * G::STAGE;
      tf_mbar_wait(tf_smem_u32(&bars[warp][s]), (uint32_t)((ch / TF_TMA_STAGES) & 1));
      const int b0 = ch * G::CB;
      const int nblk = min(G::CB, nb - b0);
      const uint64_t src = (uint64_t)(wr + (uint64_t)b0 * F::BB);
      const int off = (int)(src & 15);
      const uint64_t want = (src + (uint64_t)nblk * F::BB + 15) & ~(uint64_t)15;
      if (want > mat_end) {                                          // last row's tail: plain loads
        const uint64_t got = mat_end & ~(uint64_t)15;
        for (uint64_t p = got + lane; p < mat_end; p += 32)
          st[p - (src & ~(uint64_t)15)] = *(const uint8_t*)p;
        __syncwarp();
      }
      const uint8_t* blk0 = st + off;
      for (int it = lane; it < nblk * F::PARTS; it += 32) {
        const int b = it / F::PARTS, p = it % F::PARTS;
        const int gb = b0 + b;
        F::template dot<NC>(blk0 + b * F::BB, p, xq + (uint64_t)gb * F::QK, xd + gb * (F::QK / 32),
                            xs16 + gb * (F::QK / 16), K, acc);
      }
      __syncwarp();                                                  // stage fully read
      if (lane == 0 && ch + TF_TMA_STAGES < nch) {
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        tf_tma_issue<F>(wr, nb, ch + TF_TMA_STAGES, st, tf_smem_u32(&bars[warp][s]), mat_end);
      }
    }
  }
#if defined(TF_TMA_PDL)
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
#pragma unroll
  for (int c = 0; c < NC; ++c) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[c] += __shfl_xor_sync(0xFFFFFFFFu, acc[c], o);
  }
  if (lane == 0 && active) {
#pragma unroll
    for (int c = 0; c < NC; ++c) y[(uint64_t)c * n_out + row] = acc[c];
  }
}
