#!/bin/bash
# Session 12, device call 2 (written in session 11). Carry [".whl", ".tcache_in", ".fixtures"].
# The placed (8 GiB) model's batched paths, both new in session 11 and not yet run on the device:
#  1. speculative decoding (verify blocks: host rows of the matrices sharing an input in one CPU
#     call, lin_many; the host kernels' vector epilogue);
#  2. prefill: host rows on the CPU vs streamed through the host-row ring (TIGHTFIT_PLACED_RING=1,
#     off by default until this measures it).
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 570 \
 "spec8g|200|python3 bench/spec.py --seedmix --vram 8GiB --forced-modes fixed,adaptive --force-accept 0,0.8 --max-tokens 48 --skip-real --budget-s 180 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -8" \
 "prefill|300|python3 bench/placed_prefill.py --tokens 512,2048 > \$D/full.txt 2>&1; rc=\$?; grep -v Warn \$D/full.txt | tail -8; exit \$rc"
