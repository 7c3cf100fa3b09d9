#!/bin/bash
# Session 18, device call 5. Carry [".whl", ".tcache_in", ".fixtures"].
# gemv_mmh "foldp" with the next block's loads in flight (foldp_nb2); and what is live beside the
# arena at the peak of a placed 27B's speculative rounds (mtp_peak --where: trace replay).
exec bash bench/suite.sh 560 \
 "mmh|150|python3 bench/mmh.py --out \$D --shapes 5120x17408,17408x5120,5120x12288,5120x10240 --ns 1,5 --check-ns 5" \
 "synth|300|python3 bench/mtp_peak.py --vram 24GiB --ctx 4096 --tokens 96 --mode synth --where --out \$D 2>&1 | grep -v Warn | tail -45"
