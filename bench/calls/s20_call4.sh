#!/bin/bash
# Session 20, device call 4 (the final tree). Carry [".whl", ".tcache_in", ".fixtures"].
# Device tests of the speculative path; M = 1 against M = 5 per kernel (what the columns still
# cost); the copying 27B with the real drafters (tokens against plain decoding, with Q5_K's new
# epilogue and tiling); the placed 27B's peak against its plan now that the first block captures
# every block size.
export TIGHTFIT_DEVICE_EMBED=1
V15='python3 bench/verify_profile.py --ms 1,5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph" $D/v.txt | head -4; exit $rc'
C='python3 bench/spec.py --copycat --n-ctx 8192 --force-accept "" --real-prompts edit,quote,agent --max-tokens 256 --max-draft 16 --budget-s 150 --out $D > $D/full.txt 2>&1; rc=$?; grep -v Warn $D/full.txt | tail -8; exit $rc'
exec bash bench/suite.sh 560 \
 "tests|120|python3 -m pytest -q tests/test_block_step_replay.py tests/test_spec_block.py tests/test_verify_placed.py tests/test_gemv_mmh_device.py 2>&1 | grep -E '^E  |passed|failed|Error' | cut -c1-400 | tail -8" \
 "ms15|60|$V15" \
 "copycat|180|$C" \
 "peak|130|python3 bench/mtp_peak.py --vram 24GiB --ctx 4096 --tokens 96 --mode synth --out \$D > \$D/full.txt 2>&1; tail -8 \$D/full.txt"
