#!/bin/bash
# Session 16, device call 4. Carry [".whl", ".tcache_in", ".fixtures"].
# The MTP prefill through GPUModel.prefill_hidden (the plain prefill's chunks and kernels): device
# tests, then the MTP drafter forced 0 / 80 % at k = 2, 3, 4 and on free text (graph on).
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 400 \
 "tests|150|python3 -m pytest -q -x tests/test_spec_mtp_graph.py tests/test_spec_mtp.py tests/test_plan_mtp.py 2>&1 | tail -4" \
 "graph|230|python3 bench/spec.py --seedmix --mtp --forced-modes fixed --forced-drafter mtp --force-accept 0,0.8 --synth-k 2,3,4 --max-tokens 256 --drafters mtp --real-prompts prose --repeat 1 --budget-s 200 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | grep -E 'MTP |forced|real|total|Error|error' | tail -12"
