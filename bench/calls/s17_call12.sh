#!/bin/bash
# Session 17, device call 12. Carry [".whl", ".tcache_in", ".fixtures"].
# Sampled MTP drafting captured (temperature > 0): the MTP graph's device tests (captured = eager
# bitwise, the pool within the plan), then ms per drafted token on the seed-mix 27B, greedy graph,
# sampled graph, and the sampled bodies run eagerly.
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 330 \
 "tests|120|python3 -m pytest -q tests/test_spec_mtp_graph.py 2>&1 | grep -E '^E |passed|failed|Error' | tail -6" \
 "sample|180|python3 bench/mtp_sample.py 2>&1 | grep -v Warn | tail -3"
