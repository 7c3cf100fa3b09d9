#!/bin/bash
# Session 24, device call 3. Carry [".whl", ".tcache_in"].
# The verify block runs attn_qkv + attn_gate as one launch per GDN layer (rows [u | zg]; the conv,
# the gated norm and the commit read them through the row stride), besides call 2's FFN pairs and
# grid formats. The step and M = 5 per kernel; the forced rows in both readings of "80 %"; device
# tests of the touched paths; the copying 27B with the real drafters (speculative rows must equal
# plain decoding).
export TIGHTFIT_DEVICE_EMBED=1
V='python3 bench/verify_profile.py --ms 1,5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph|^ *[15] " $D/v.txt | head -8; exit $rc'
S='python3 bench/spec.py --seedmix --forced-modes fixed,adaptive --force-accept 0,0.8 --force-as both --synth-k 4 --max-tokens 512 --skip-real --budget-s 200 --out $D > $D/full.txt 2>&1; rc=$?; grep -v Warn $D/full.txt | tail -12; grep -o "round_wall[^}]*}" $D/full.txt; exit $rc'
T='python3 -m pytest -q tests/test_verify_graph.py tests/test_block_step_replay.py tests/test_kernels_fused_quant.py -p no:cacheprovider 2>&1 | tail -4'
C='python3 bench/spec.py --copycat --n-ctx 4096 --force-accept "" --real-prompts edit --max-tokens 128 --max-draft 16 --budget-s 80 --out $D > $D/full.txt 2>&1; rc=$?; grep -v Warn $D/full.txt | tail -6; exit $rc'
exec bash bench/suite.sh 590 "ms15|100|$V" "spec|210|$S" "tests|150|$T" "copycat|100|$C"
