#!/bin/bash
# Session 9, device call 6 (carry [".whl", ".tcache_in", ".fixtures"]).
#  - issue 10: the verify block's fused activation quantization (241 of 257 quantize launches per
#    M = 5 pass go): GPU tests, verify_profile with and without (TIGHTFIT_FUSE_QUANT=0), forced
#    acceptance bench;
#  - issue 5: the 8 GiB placed decode with and without the host prefetch on ONE host.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
exec bash bench/suite.sh 560 \
 "tests|90|python3 -m pytest -q -rf --tb=short tests/test_verify_graph.py tests/test_executor_fused_quant.py > \$D/full.txt 2>&1; rc=\$?; grep -E '^FAILED|^E  |passed|failed' \$D/full.txt | head; exit \$rc" \
 "verify|100|for f in 1 0; do mkdir -p \$D/f\$f; TIGHTFIT_FUSE_QUANT=\$f python3 bench/verify_profile.py --ms 1,5 --out \$D/f\$f > \$D/f\$f.txt 2>&1; echo \"fuse \$f\"; tail -4 \$D/f\$f.txt; done" \
 "spec|120|TIGHTFIT_DEVICE_EMBED=1 python3 bench/spec.py --seedmix --skip-real --forced-modes fixed --budget-s 100 --out \$D > \$D/full.txt 2>&1; rc=\$?; tail -14 \$D/full.txt; exit \$rc" \
 "pf|230|for p in 2048 0; do TIGHTFIT_CPU_PREFETCH=\$p python3 bench/plan_vram.py --budgets 8GiB --tokens 6 --profile-tokens 6 --profile-threads 0 --out \$D/p\$p > \$D/p\$p.txt 2>&1; echo \"prefetch \$p: \$(grep -E 'kernel-only' \$D/p\$p.txt | head -1)\"; grep -E '^ +8GiB' \$D/p\$p.txt | head -1; done"
