#!/bin/bash
# Session 8, device call 4 (carry [".whl", ".tcache_in", ".fixtures"]). Issue 11: call 3's
# PDL-off profile at depth 0 has the CUDA tq3 attention kernel at 14.0 us per layer with one
# cached row (the Triton one 6.5, f16's 4.4): a fixed cost that is also inside its 46.8 us at
# 32K. Suspects: the 94 KB of dynamic shared memory per CTA (the SM's L1/shared carveout
# switched around every attention launch, between GEMVs that use none), the 256 CTAs of a
# 64-chunk grid. Build variants through the loader's env knobs: ring depth 2, 4 warps, 16/32
# launched chunks; each at depth 0 and 32K, PDL off (per-kernel times valid).
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
V="for d in 0 32768; do mkdir -p \$D/\$d; TIGHTFIT_PDL=0 python3 bench/step_profile.py --kv-type tq3 --depth \$d --steps 6 --out \$D/\$d > \$D/\$d.txt 2>&1; echo \"depth \$d: \$(grep -E '^step' \$D/\$d.txt | cut -c1-60) | \$(grep -E 'attn_q_kernel' \$D/\$d.txt | tr -s ' ' | cut -d' ' -f2-4)\"; done"
exec bash bench/suite.sh 560 \
 "base|60|$V" \
 "nst2|60|export TIGHTFIT_ATTNQ_NST=2; $V" \
 "nw4|60|export TIGHTFIT_ATTNQ_NW=4; $V" \
 "nw4nst2|60|export TIGHTFIT_ATTNQ_NW=4 TIGHTFIT_ATTNQ_NST=2; $V" \
 "nl32|60|export TIGHTFIT_ATTNQ_NL=32; $V" \
 "nl16|60|export TIGHTFIT_ATTNQ_NL=16; $V"
