#!/bin/bash
# Session 13, device call 1 (written in session 12, not run: that session's device time was spent).
# Carry [".whl", ".tcache_in", ".fixtures"] (refresh .tcache_in from the newest /work/.device/N).
#  1. issue 5's headline with the roofline's bandwidth now the best of four reads (numba / torch,
#     before the load / after the decode), 8 GiB, default PCIe share 0.4;
#  2. issue 10: the revised policy on the placed 8 GiB model at forced 0 % (modelled: four probes,
#     then `hopeless`; session 12 call 2 measured 0.64x / 0.85x with the old policy).
export TIGHTFIT_DEVICE_EMBED=1
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
exec bash bench/suite.sh 570 \
 "plan8|240|python3 bench/plan_vram.py --budgets 8GiB --tokens 16 --profile-tokens 6 --profile-threads 0 --out \$D > \$D/full.txt 2>&1; rc=\$?; grep -v Warn \$D/full.txt | grep -E 'tok/s|roofline|GiB' | tail -6; exit \$rc" \
 "spec8g|280|python3 bench/spec.py --seedmix --vram 8GiB --forced-modes adaptive --force-accept 0 --max-tokens 128 --skip-real --budget-s 220 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -6"
