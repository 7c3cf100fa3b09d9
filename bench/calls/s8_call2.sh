#!/bin/bash
# Session 8, device call 2 (carry [".whl", ".tcache_in", ".fixtures"]). Issue 11: the K/V write
# kernel's rotations now in registers (tightfit/kernels/rht.py) instead of streaming R from L2
# (call 1's PDL-off profile: 19.9 us per layer for the q rotation alone). Device tests of the
# rotation and the write/attention kernels, tq3 vs f16 decode at 0 / 32K twice (one process per
# pair, the f16 control next to it), the PDL-off step profile; then the two device test modules
# not run on a GPU since session 6 moved them onto tests/_gpu_blocks.py.
# Compile-checked offline: scripts/compile_check.py -k kv_write (--regs: 56 registers, no spills).
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
exec bash bench/suite.sh 560 \
 "kvtests|90|python3 -m pytest -q -rf --tb=short tests/test_rht.py tests/test_kvquant_kernel.py tests/test_executor_kvquant.py > \$D/full.txt 2>&1; rc=\$?; grep -E '^FAILED|^E  |passed|failed' \$D/full.txt | head -20; exit \$rc" \
 "ab|130|for r in 1 2; do TIGHTFIT_DEVICE_EMBED=1 python3 bench/e2e.py --tokens 48 --depths 0,32768 --ctx 33408 --kv-types f16,tq3 --out \$D/r\$r > \$D/r\$r.txt 2>&1; grep -E '^ +(f16|tq3) ' \$D/r\$r.txt; done" \
 "prof|50|TIGHTFIT_PDL=0 python3 bench/step_profile.py --kv-type tq3 --depth 32768 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | grep -E 'step|gemv |attention|_qkv_write|attn_q|merge' | head -12" \
 "devtests|90|python3 -m pytest -q -rf --tb=short tests/test_gemv_mma_device.py tests/test_pdl_device.py > \$D/full.txt 2>&1; rc=\$?; grep -E '^FAILED|^E  |passed|failed' \$D/full.txt | head -20; exit \$rc"
