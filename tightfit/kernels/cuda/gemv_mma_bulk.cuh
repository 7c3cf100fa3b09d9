// tightfit skinny GEMM on int8 tensor cores, weights staged by bulk copies ("mma bulk"):
// tf_mma_rt's arithmetic (gemv_mma.cuh: fragments, groups, epilogue) with the weight bytes brought
// into shared memory by the copy engine (cp.async.bulk, sm_90) instead of by the warps' own loads.
// Include after gemv_mma.cuh.
//
// Why (bench/NOTES.md, sessions 13-14): tf_mma_rt at N = 5 runs 1.6-1.8x its N = 1 time and ~45 %
// of the bus. Its warps hold one step's raw words in registers (4 rows x 1 block per lane, 128
// registers), so an SM has at most 16 warps x 544 B ~ 9 KB of weights in flight, against the ~30 KB
// per SM that the bus's latency x bandwidth asks for; it waits on latency, not on arithmetic (ALU
// pipe ~40 % busy). A bulk copy is one instruction per row segment and needs no registers, so the
// bytes in flight are set by the shared-memory ring: NST stages of 64 rows x 4 blocks (IQ4_XS: 35 KB
// per stage), a whole stage in flight while the warps compute the previous one.
//
// CTA = 8 warps, 256 threads, no producer warp. Tile group = 64 rows; warp w computes rows
// 32 * (w >> 2) .. + 31 (two 16-row tiles, as tf_mma_rt) of block (w & 3) of each stage, so the 4
// warps of a row half split K and are summed in shared memory, in a fixed order, at the end of the
// CTA's piece of a tile group.
// Work split: stream-K over CTAs. Items = (tile group, stage of SB = 4 blocks), spt = ceil(nb / 4);
// CTA c of nc takes items [I c / nc, I (c + 1) / nc). A tile group cut between CTAs is finished by
// the deterministic fixup of gemv_mma.cuh with CTAs in the role of warps (same formulas: slots,
// arrival counter, the last arriving CTA sums the pieces in ascending CTA order). Bitwise
// repeatable; no zeroing of y.
// Ring: NST stages; stage slot of row r (0..63) at r * SR, holding the 16-byte aligned window that
// contains the row's blocks of the item (the row's bytes start at slot + (offset mod 16), so every
// alignment the formats' load() relies on in global memory holds in the slot; SR = 16 mod 32
// bytes: a fragment's 4-byte loads hit 32 distinct banks). One mbarrier per stage ("full": one
// arrival with the stage's byte count, then the copies' complete_tx). The warp that finishes a
// stage last (a shared counter) refills it with the item NST ahead, so no warp waits for a
// producer: the copies of the next NST - 1 items are in flight while every warp computes.
// Reads past the matrix: a row's window is rounded up to 16 bytes, so the last row may read up to
// 15 bytes past the tensor (gemv_mma_bulk.py checks that its storage holds them).
#pragma once

#define TF_MMB_ROWS 64       // rows per tile group (two row halves of 32)
#define TF_MMB_OUT 512       // outputs per tile group and column tile: 2 halves x 8 floats x 32 lanes

// SB blocks per row per stage, one per warp of a row half: 2 * SB warps per CTA. MINB resident
// CTAs per SM (launch bounds): SB = 4, MINB = 2 -> 128 registers; SB = 2, MINB = 5 -> 96 registers
// and 20 warps per SM (the raw words live only from the shared-memory load to the decode, so fewer
// registers cost no bytes in flight).
template <class M, int NST, int SB> struct tf_mmb_geo {
  static constexpr int WARPS = 2 * SB, THREADS = 64 * SB;
  static constexpr int CPR = (SB * M::BB + 15 + 15) / 16;           // 16-byte chunks per row window
  static constexpr int SR = (CPR & 1) ? 16 * CPR : 16 * CPR + 16;   // slot stride, 16 mod 32
  static constexpr int STAGE = TF_MMB_ROWS * SR;
  static constexpr int HDR = 128;                 // mbarriers [NST] + done counters [NST] + flag
  static constexpr int RED = WARPS * 8 * 32 * 4;                    // partial sums per warp
  static constexpr int SMEM = HDR + RED + NST * STAGE;              // dynamic shared memory
};

#if TF_DEVICE
TF_DEV void tf_mmb_bar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
TF_DEV void tf_mmb_arrive_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
TF_DEV void tf_mmb_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n"
      "TF_MMB_WAIT:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra TF_MMB_WAIT;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
TF_DEV void tf_mmb_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// The copies of item j (tile group tg, stage s) into stage buffer sb (shared address), by one
// warp: lane l copies rows l and l + 32 of the group; lane 0 first announces the byte count.
template <class M, int NST, int SB>
TF_DEV void tf_mmb_issue(const uint8_t* __restrict__ W, uint32_t sb, uint32_t bar, int lane, int tg,
                         int s, int nb, int n_out, uint32_t rowbytes) {
  using G = tf_mmb_geo<M, NST, SB>;
  const int blocks = nb - s * SB < SB ? nb - s * SB : SB;
  const uint32_t soff = (uint32_t)s * (SB * M::BB);
  uint64_t lo[2];
  uint32_t n[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    int row = tg * TF_MMB_ROWS + lane + 32 * i;
    row = row < n_out ? row : n_out - 1;
    const uint64_t off = (uint64_t)row * rowbytes + soff;
    lo[i] = off & ~(uint64_t)15;
    n[i] = (uint32_t)(((off + (uint64_t)(blocks * M::BB) + 15) & ~(uint64_t)15) - lo[i]);
  }
  const uint32_t total = __reduce_add_sync(0xffffffffu, n[0] + n[1]);
  if (lane == 0) tf_mmb_arrive_tx(bar, total);
  __syncwarp();
#pragma unroll
  for (int i = 0; i < 2; ++i) tf_mmb_copy(sb + (lane + 32 * i) * G::SR, W + lo[i], n[i], bar);
}

// End of the CTA's piece of tile group tg: sum the SB K-warps of each row half in shared memory
// (ascending warp order), then store (whole: the CTA covered the group) or run the fixup across
// CTAs. Thread i owns outputs i, i + THREADS, ... of the group's 512 (h = o >> 8, float f, lane).
template <int SB>
TF_DEV void tf_mmb_finish(float* __restrict__ y, float* red, int* flag, int n_out, int ncols,
                          int tg, bool whole, tf_mma_ix items, int spt, int* cnt, float* part,
                          const float (&acc)[2][1][4]) {
  constexpr int NT = 64 * SB, KO = TF_MMB_OUT / NT;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int f = 0; f < 8; ++f) red[(warp * 8 + f) * 32 + lane] = acc[f >> 2][0][f & 3];
  __syncthreads();
  float v[KO];
#pragma unroll
  for (int k = 0; k < KO; ++k) {
    const int o = threadIdx.x + NT * k, h = o >> 8, f = (o >> 5) & 7, ln = o & 31;
    const float* p = red + ((SB * h) * 8 + f) * 32 + ln;
    v[k] = p[0];
#pragma unroll
    for (int q = 1; q < SB; ++q) v[k] += p[q * 8 * 32];       // ascending warp order
  }
  __syncthreads();                     // red is free for the next group
  const tf_mma_ix nc = gridDim.x, c = blockIdx.x;
  const tf_mma_ix a = (tf_mma_ix)tg * spt;
  if (!whole) {
    float* mine = part + (c * 2 + tf_mma_slot(items, nc, a, c)) * TF_MMB_OUT;
#pragma unroll
    for (int k = 0; k < KO; ++k) __stcg(mine + threadIdx.x + NT * k, v[k]);
    __threadfence();                   // release: this CTA's slot before its arrival
    __syncthreads();
    if (threadIdx.x == 0)
      *flag = atomicAdd(cnt + tg, 1) == tf_mma_pieces(items, nc, spt, a) - 1;
    __syncthreads();
    if (!*flag) return;                // CTA-uniform: not the last piece
    __threadfence();                   // acquire: the other pieces' slots
    const int P = tf_mma_pieces(items, nc, spt, a);
    const tf_mma_ix wf = tf_mma_owner(items, nc, a);
    for (int k = 0; k < P; ++k) {      // ascending CTA order
      const tf_mma_ix u = tf_mma_piece(items, nc, a, wf, k);
      const float* p = part + (u * 2 + (k == 0 ? tf_mma_slot(items, nc, a, u) : 0)) * TF_MMB_OUT;
#pragma unroll
      for (int kk = 0; kk < KO; ++kk) {
        const float x = __ldcg(p + threadIdx.x + NT * kk);
        v[kk] = k == 0 ? x : v[kk] + x;
      }
    }
    if (threadIdx.x == 0) cnt[tg] = 0;
  }
#pragma unroll
  for (int k = 0; k < KO; ++k) {
    const int o = threadIdx.x + NT * k, h = o >> 8, f = (o >> 5) & 7, ln = o & 31;
    const int i = f & 3;
    const int row = tg * TF_MMB_ROWS + 32 * h + 16 * (f >> 2) + (ln >> 2) + (i >= 2 ? 8 : 0);
    const int col = 2 * (ln & 3) + (i & 1);
    if (col < ncols && row < n_out) y[(uint64_t)col * n_out + row] = v[k];
  }
}

// N <= 8 columns (one B tile). See gemv_mma.cuh for the fragment, epilogue and fixup conventions.
template <class M, int NST, int SB, int MINB>
__global__ void __launch_bounds__(64 * SB, MINB)
tf_mmb(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq, const float* __restrict__ xd,
       const int* __restrict__ xs16, float* __restrict__ y, int n_out, int K, int ncols,
       int* cnt, float* part) {
  using G = tf_mmb_geo<M, NST, SB>;
  extern __shared__ __align__(128) uint8_t tf_mmb_smem[];
  int* done = (int*)(tf_mmb_smem + 8 * NST);      // warps finished with the stage's current fill
  int* flag = done + NST;
  float* red = (float*)(tf_mmb_smem + G::HDR);
  uint8_t* ring = tf_mmb_smem + G::HDR + G::RED;
  const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(tf_mmb_smem);
  const uint32_t ring_s = (uint32_t)__cvta_generic_to_shared(ring);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int h = warp / SB, q = warp % SB;
  const int nb = K / M::QK;
  const uint32_t rowbytes = (uint32_t)nb * M::BB;
  const int spt = (nb + SB - 1) / SB;
  const int groups = (n_out + TF_MMB_ROWS - 1) / TF_MMB_ROWS;
  const tf_mma_ix items = (tf_mma_ix)groups * spt;
  const tf_mma_ix nc = gridDim.x, c = blockIdx.x;
  const int ibeg = (int)(items * c / nc), iend = (int)(items * (c + 1) / nc);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < NST; ++s) {
      tf_mmb_bar_init(bar0 + 8 * s, 1);
      done[s] = 0;
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == 0) {                     // prologue: the range's first NST items
#pragma unroll
    for (int p = 0; p < NST; ++p) {
      const int j = ibeg + p;
      if (j < iend) {
        const int jg = j / spt;
        tf_mmb_issue<M, NST, SB>(W, ring_s + p * G::STAGE, bar0 + 8 * p, lane, jg, j - jg * spt, nb,
                             n_out, rowbytes);
      }
    }
  }
  int xo[1], co[1][2];
  xo[0] = (g < ncols ? g : ncols - 1) * K;
#pragma unroll
  for (int cc = 0; cc < 2; ++cc) {
    const int ce0 = 2 * t + cc, ce = ce0 < ncols ? ce0 : ncols - 1;
    co[0][cc] = ce * (K >> 5);
  }
  int L = 0;                           // the CTA's item index (ring use)
  int it = ibeg;
  while (it < iend) {                  // CTA-uniform
    const int tg = it / spt, s0 = it - tg * spt;
    const int s1 = spt < s0 + (iend - it) ? spt : s0 + (iend - it);
    float acc[2][1][4];
#pragma unroll
    for (int rt = 0; rt < 2; ++rt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[rt][0][i] = 0.f;
    for (int s = s0; s < s1; ++s, ++L) {
      const int buf = L % NST;
      tf_mmb_wait(bar0 + 8 * buf, (uint32_t)(L / NST) & 1u);
      const int b = s * SB + q;
      if (b < nb) {
        const uint8_t* sb = ring + buf * G::STAGE;
        const uint32_t soff = (uint32_t)s * (SB * M::BB);   // the stage's offset in a row
        typename M::Raw r0[2], r1[2];
#pragma unroll
        for (int rt = 0; rt < 2; ++rt) {
          // slots sa, sa + 8 = rows of the group; a row's bytes start at its slot + (its global
          // offset mod 16), as tf_mmb_issue copied them (mod 2^32 keeps the offset mod 16)
          const int sa = 32 * h + 16 * rt + g;
          const int ra = tg * TF_MMB_ROWS + sa, rb = ra + 8;
          const uint32_t ma = ((uint32_t)(ra < n_out ? ra : n_out - 1) * rowbytes + soff) & 15u;
          const uint32_t mb = ((uint32_t)(rb < n_out ? rb : n_out - 1) * rowbytes + soff) & 15u;
          M::load(sb + sa * G::SR + ma + q * M::BB, t, r0[rt]);
          M::load(sb + (sa + 8) * G::SR + mb + q * M::BB, t, r1[rt]);
        }
        tf_mma_block<M, 1, 2>(r0, r1, t, b, xq, xd, xs16, xo, co, acc);
      }
      // release the stage: the last warp to finish it refills it with the item NST ahead
      __syncwarp();
      int last = 0;
      if (lane == 0) {
        __threadfence_block();         // this warp's reads of the stage before its count
        last = atomicAdd(done + buf, 1) == G::WARPS - 1;
        if (last) done[buf] = 0;
      }
      last = __shfl_sync(0xffffffffu, last, 0);
      if (last) {
        const int j = ibeg + L + NST;
        if (j < iend) {
          __threadfence_block();
          asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
          const int jg = j / spt;
          tf_mmb_issue<M, NST, SB>(W, ring_s + buf * G::STAGE, bar0 + 8 * buf, lane, jg,
                               j - jg * spt, nb, n_out, rowbytes);
        }
      }
    }
    tf_mmb_finish<SB>(y, red, flag, n_out, ncols, tg, s0 == 0 && s1 == spt, items, spt, cnt,
                       part, acc);
    it += s1 - s0;
  }
}
#endif  // TF_DEVICE
