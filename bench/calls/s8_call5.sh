#!/bin/bash
# (Historical record: TIGHTFIT_HOST_ROWS=anon, arena.host_copy and plan_vram's mmap/anon A/B were removed after this call: no gain.)
# Session 8, device call 5 (carry [".whl", ".tcache_in", ".fixtures"]).
#  - issue 11: tq3 vs f16 decode at 0 / 32K (two runs, f16 control in the same process) with the
#    attention kernel at 4 warps per CTA (call 4: 36.8 vs 46.8 us per layer at 32K) and the write
#    kernel's codebook lookups as selects (no gathers); the PDL-off step profile at 32K;
#  - tests/test_pdl_device.py (not run on a GPU since session 6 moved it onto tests/_gpu_blocks);
#  - issue 5: the 8 GiB placed decode (0.44-0.51 of the host roofline, bar 0.80), host rows read
#    from the file mapping (default) vs anonymous huge-page memory (TIGHTFIT_HOST_ROWS=anon).
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
exec bash bench/suite.sh 565 \
 "ab|150|for r in 1 2; do TIGHTFIT_DEVICE_EMBED=1 python3 bench/e2e.py --tokens 48 --depths 0,32768 --ctx 33408 --kv-types f16,tq3 --out \$D/r\$r > \$D/r\$r.txt 2>&1; grep -E '^ +(f16|tq3) ' \$D/r\$r.txt; done" \
 "prof|40|TIGHTFIT_PDL=0 python3 bench/step_profile.py --kv-type tq3 --depth 32768 --steps 6 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | grep -E '^step|attn_q|merge|qkv' | head -6" \
 "pdltest|50|python3 -m pytest -q -rf --tb=short tests/test_pdl_device.py > \$D/full.txt 2>&1; rc=\$?; grep -E '^FAILED|^E  |passed|failed' \$D/full.txt | head -20; exit \$rc" \
 "mmap|150|python3 bench/plan_vram.py --budgets 8GiB --tokens 6 --profile-tokens 6 --profile-threads 0 --out \$D > \$D/full.txt 2>&1; rc=\$?; tail -22 \$D/full.txt; exit \$rc" \
 "anon|150|TIGHTFIT_HOST_ROWS=anon python3 bench/plan_vram.py --budgets 8GiB --tokens 6 --profile-tokens 6 --profile-threads 0 --out \$D > \$D/full.txt 2>&1; rc=\$?; tail -22 \$D/full.txt; exit \$rc"
