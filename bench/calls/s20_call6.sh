#!/bin/bash
# Session 20, device call 6. Carry [".whl", ".tcache_in", ".fixtures"].
# Both measured the same (RESULTS session 20, call 6): the FFMA form was removed again (the code is in
# its commit); the last step ran Q6_K on dp4a (without the ring its route crossover is N = 8).
# Every tensor-core format's ws * dot in one FFMA (Q6_K's verify products, the head among them)
# against unbias-then-multiply (TIGHTFIT_MMA_FFMA_WS=0), same machine; and Q6_K on the plain
# kernel at one row tile (no cp.async ring) now that the ring's rt 2 spills 76 / 96 bytes.
export TIGHTFIT_DEVICE_EMBED=1
V5='python3 bench/verify_profile.py --ms 5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "graph|M_Q6_K|M_Q4_K|M_Q5_K" $D/v.txt | head -5; exit $rc'
exec bash bench/suite.sh 300 \
 "tests|80|python3 -m pytest -q -x tests/test_gemv_mma_device.py 2>&1 | grep -E '^E  |passed|failed|Error' | cut -c1-400 | tail -8" \
 "ffma|45|$V5" \
 "noffma|45|TIGHTFIT_MMA_FFMA_WS=0 $V5" \
 "q6rt1|50|TIGHTFIT_MMA_PIPE=0 TIGHTFIT_MMA_RT=1 $V5"
