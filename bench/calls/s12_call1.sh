#!/bin/bash
# Session 12, device call 1 (written in session 11, not run: that session's device time was spent).
# Carry [".whl", ".tcache_in", ".fixtures"] (refresh .tcache_in from the newest /work/.device/N).
# Issue 5: the host kernels' vector epilogue (cpu_gemv_avx512_loop, default since session 11;
# 1.04-1.39x one thread in cache on the development host) against the scalar form, on the device
# host, where IQ4_XS / Q4_K / Q5_K ran compute-bound (82-94 GB/s vs Q6_K's 135):
#  1. kernels per batch width, both forms (bench/cpu_gemv_batch.py);
#  2. the 8 GiB placed decode, vector then scalar (roofline ratio: the 0.80 bar);
# (then bench/calls/s12_call2.sh: speculation and prefill on the placed model)
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 570 \
 "hostbatch|90|python3 bench/cpu_gemv_batch.py --copies 12 --reps 3 --batches 1,2,4,5 > \$D/full.txt 2>&1; rc=\$?; grep -v Warn \$D/full.txt; exit \$rc" \
 "plan8|320|for e in vector scalar; do TIGHTFIT_CPU_EPILOGUE=\$e python3 bench/plan_vram.py --budgets 8GiB --tokens 6 --profile-tokens 6 --profile-threads 0 --out \$D/\$e > \$D/\$e.txt 2>&1; echo \"epilogue \$e\"; grep -iE 'tok/s|roofline|GB/s' \$D/\$e.txt | tail -6; done"
