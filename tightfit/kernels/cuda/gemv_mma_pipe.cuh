// tightfit skinny GEMM on int8 tensor cores, pipelined ("mma pipe"): tf_mma_rt's arithmetic
// (gemv_mma.cuh: fragments, groups, epilogue, flush) with the weight bytes staged through a
// per-warp shared-memory ring by cp.async. Include after gemv_mma.cuh.
//
// Why: tf_mma / tf_mma_rt load a step's raw words into registers and then decode and multiply
// them, so each warp alternates "all loads in flight" and "none in flight"; at 128 registers there
// is no room to hold a second step in registers. ncu-free arithmetic (session 9): IQ4_XS at N = 5
// took 25 us per 5120x17408 matrix, about the sum of its issue time (~8 us) and its bus time
// (~11 us), i.e. no overlap inside a warp. Here the copies of the next NST - 1 work items are in
// flight (in shared memory, no registers) while the warp computes the current one.
// Measured (session 10, calls 1-3): a win for Q6_K only (N = 5: 63.5 -> 52.0 us on 5120x17408,
// the output head 651 -> 501 us), 2-20 % slower for IQ4_XS / Q4_K / Q5_K: ncu showed those
// issue-bound (0.5 IPC per scheduler at 3 active warps, ALU pipe half busy), not load-bound.
// gemv_mma.PIPE_DEFAULT_TYPES holds the formats that use it by default.
//
// Ring: one per warp, NST stages of ROWS = 16 * RT row slots; a slot holds the item's U blocks of
// one row as the 16-byte aligned chunks that contain them (the block starts at slot + mis, where
// mis = the byte offset of those blocks mod 16, so every alignment the formats' load() relies on
// in global memory holds in the slot). Slot stride SR = 16 mod 32 bytes: a lane's row g lands in
// bank group 4g (x SR / 16), so the 4-byte loads of a fragment (lanes (g, t): word 4g + t + c)
// hit 32 distinct banks for any CPR.
// Copies: chunk (r, c) of an item (r < ROWS, c < CPR) goes to lane (r * CPR + c) mod 32; a chunk
// past the item's bytes is not issued, a partial last chunk reads only its valid bytes (cp.async
// src-size: nothing is read past the matrix). Rows past n_out copy row n_out - 1 (never stored).
// Sync: cp.async.wait_group NST - 1 then __syncwarp before reading a stage (lanes read chunks
// other lanes copied); __syncwarp after computing it, before the stage is refilled.
// Formats: every format whose load() uses plain (generic) loads. M_Q8_0 reads through __ldg
// (global-only) and stays on tf_mma_rt.
#pragma once

#if TF_DEVICE
TF_DEV void tf_mmp_cp16(uint32_t s, const void* g, int n) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g), "r"(n) : "memory");
}
TF_DEV void tf_mmp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> TF_DEV void tf_mmp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
#endif

template <class M, int RT, int NST> struct tf_mmp_geo {
  static constexpr int U = tf_mma_u<M, 1, RT>::U;              // blocks per work item
  static constexpr int ROWS = 16 * RT;
  static constexpr int CPR = (U * M::BB + 15 + 15) / 16;        // chunks per row, any misalignment
  static constexpr int SR = (CPR & 1) ? 16 * CPR : 16 * CPR + 16;   // slot stride, 16 mod 32
  static constexpr int STAGE = ROWS * SR;
  static constexpr int WARP_BYTES = NST * STAGE;
  static constexpr int CTA_BYTES = TF_MMA_WARPS * WARP_BYTES;  // dynamic shared memory per CTA
  static constexpr int CPL = (ROWS * CPR + 31) / 32;          // copy instructions per lane
};

#if TF_DEVICE
// Issue the copies of item (tg, s) into stage buffer sb (shared address).
template <class M, int RT, int NST>
TF_DEV void tf_mmp_issue(const uint8_t* __restrict__ W, uint32_t sb, int lane, int tg, int s,
                         int nb, int n_out, uint32_t rowbytes) {
  using G = tf_mmp_geo<M, RT, NST>;
  const int blocks = nb - s * G::U < G::U ? nb - s * G::U : G::U;
  const int bytes = blocks * M::BB;
  const uint64_t soff = (uint64_t)s * (G::U * M::BB);
#pragma unroll
  for (int i = 0; i < G::CPL; ++i) {
    const int idx = lane + 32 * i;
    if ((G::ROWS * G::CPR) % 32 == 0 || idx < G::ROWS * G::CPR) {
      const int r = idx / G::CPR, c = idx - r * G::CPR;
      int row = tg * G::ROWS + r;
      row = row < n_out ? row : n_out - 1;
      const uint64_t off = (uint64_t)row * rowbytes + soff;
      const int n = (int)(off & 15u) + bytes - 16 * c;
      if (n > 0)
        tf_mmp_cp16(sb + r * G::SR + 16 * c, W + ((off & ~(uint64_t)15) + 16 * c), n < 16 ? n : 16);
    }
  }
}

// Work split as tf_mma_rt (stream-K over items = (group of RT 16-row tiles, step of U blocks)),
// NT = 1 (N <= 8 columns), split tile groups through the same deterministic fixup (tf_mma_finish).
// See gemv_mma.cuh for the fragment, epilogue and fixup conventions.
template <class M, int RT, int NST>
__global__ void __launch_bounds__(TF_MMA_THREADS, TF_MMA_MINB)
tf_mma_pipe(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq, const float* __restrict__ xd,
            const int* __restrict__ xs16, float* __restrict__ y, int n_out, int K, int ncols,
            int* cnt, float* part) {
  using G = tf_mmp_geo<M, RT, NST>;
  constexpr int U = G::U;
  extern __shared__ __align__(16) uint8_t tf_mmp_smem[];
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int nb = K / M::QK;
  const uint32_t rowbytes = (uint32_t)nb * M::BB;
  const int spt = (nb + U - 1) / U;
  const int groups = (n_out + G::ROWS - 1) / G::ROWS;
  const tf_mma_ix items = (tf_mma_ix)groups * spt;
  int it, iend;
  tf_mma_warp_range(items, it, iend);
  const uint8_t* ring = tf_mmp_smem + (threadIdx.x >> 5) * G::WARP_BYTES;
  const uint32_t ring_s = (uint32_t)__cvta_generic_to_shared(ring);
  int xo[1], co[1][2];
  {
    xo[0] = (g < ncols ? g : ncols - 1) * K;
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
      const int ce0 = 2 * t + cc, ce = ce0 < ncols ? ce0 : ncols - 1;
      co[0][cc] = ce * (K >> 5);
    }
  }
  // prologue: the first NST - 1 items of the range (item j = (j / spt, j % spt))
#pragma unroll
  for (int p = 0; p < NST - 1; ++p) {
    const int j = it + p;
    if (j < iend) {
      const int jg = j / spt;
      tf_mmp_issue<M, RT, NST>(W, ring_s + p * G::STAGE, lane, jg, j - jg * spt, nb, n_out, rowbytes);
    }
    tf_mmp_commit();
  }
  int stage = 0;                                             // stage of the item computed next
  while (it < iend) {                                        // warp-uniform
    const int tg = it / spt, s0 = it - tg * spt;
    const int s1 = spt < s0 + (iend - it) ? spt : s0 + (iend - it);
    float acc[RT][1][4];
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[rt][0][i] = 0.f;
    for (int s = s0; s < s1; ++s) {
      {   // refill the stage computed last with the item NST - 1 ahead
        const int j = it + (s - s0) + NST - 1;
        if (j < iend) {
          const int jg = j / spt;
          const int fill = stage == 0 ? NST - 1 : stage - 1;
          tf_mmp_issue<M, RT, NST>(W, ring_s + fill * G::STAGE, lane, jg, j - jg * spt, nb, n_out,
                                   rowbytes);
        }
      }
      tf_mmp_commit();
      tf_mmp_wait<NST - 1>();
      __syncwarp();
      const uint8_t* sb = ring + stage * G::STAGE;
      const uint32_t soff = (uint32_t)s * (U * M::BB);       // this item's offset in the row
      const int b = s * U;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (b + u < nb) {
          typename M::Raw r0[1][RT], r1[1][RT];
#pragma unroll
          for (int rt = 0; rt < RT; ++rt) {
            // slot of row r = 16rt + 8h + g, plus (row * rowbytes + soff) mod 16 as the copy had it
            const int ra = tg * G::ROWS + 16 * rt + g, rb = ra + 8;
            const uint32_t ma = ((uint32_t)(ra < n_out ? ra : n_out - 1) * rowbytes + soff) & 15u;
            const uint32_t mb = ((uint32_t)(rb < n_out ? rb : n_out - 1) * rowbytes + soff) & 15u;
            M::load(sb + (16 * rt + g) * G::SR + ma + u * M::BB, t, r0[0][rt]);
            M::load(sb + (16 * rt + 8 + g) * G::SR + mb + u * M::BB, t, r1[0][rt]);
          }
          tf_mma_block<M, 1, RT>(r0[0], r1[0], t, b + u, xq, xd, xs16, xo, co, acc);
        }
      }
      __syncwarp();
      stage = stage + 1 == NST ? 0 : stage + 1;
    }
    tf_mma_finish<RT, 1>(y, n_out, ncols, tg, g, t, s0 == 0 && s1 == spt, spt, cnt, part,
                         acc);
    it += s1 - s0;
  }
  tf_mmp_wait<0>();
}
#endif  // TF_DEVICE
