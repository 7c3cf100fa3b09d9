#!/bin/bash
# Session 16, device call 3: call 2 with the decode attention kernel in the MTP step (no cuBLAS in the graphs). Carry [".whl", ".tcache_in", ".fixtures"].
# The MTP drafter over the executor's own raw block (GPUModel(mtp=True)) with its one-token steps
# captured (tightfit/runtime/spec/mtp_graph.py): device tests, then forced 0 / 80 % with the head
# drafting 4 tokens, graph on and off (TIGHTFIT_MTP_GRAPH=0: the same head, eager).
export TIGHTFIT_DEVICE_EMBED=1
SPEC="python3 bench/spec.py --seedmix --mtp --forced-modes fixed --forced-drafter mtp --force-accept 0,0.8 --synth-k 4 --max-tokens 256 --drafters mtp --real-prompts prose --repeat 1"
exec bash bench/suite.sh 560 \
 "tests|150|python3 -m pytest -q -x tests/test_spec_mtp_graph.py tests/test_spec_mtp.py tests/test_plan_mtp.py 2>&1 | tail -15" \
 "graph|230|$SPEC --budget-s 200 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | grep -E 'MTP head|forced|real|total|Error|error' | tail -8" \
 "eager|120|TIGHTFIT_MTP_GRAPH=0 $SPEC --budget-s 100 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | grep -E 'MTP head|forced|real|total|Error|error' | tail -8"
