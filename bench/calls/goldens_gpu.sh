#!/bin/bash
# The GPU executor vs llama.cpp on every golden file, in 4 pytest processes sharing the one GPU:
# the run is bound by compiling each geometry's kernels on the CPU (16 cores on the device).
# Full logs in $D/golden-<i>.txt; prints each case's distances and the pass/fail count.
set -u
N=${1:-4}
ids=$(python3 -c "import json;print(' '.join(c['id'] for c in json.load(open('tests/goldens/manifest.json'))['cases']))")
T=tests/test_goldens_executor.py::test_gpu_executor_matches_llama_cpp
i=0; for id in $ids; do shard[$i]+=" $T[$id]"; i=$(( (i + 1) % N )); done   # exact node ids
for i in $(seq 0 $((N - 1))); do
  python3 -m pytest -q -s -rf --tb=short --durations=5 ${shard[$i]} > "$D/golden-$i.txt" 2>&1 &
done
wait
grep -hE "vs llama" "$D"/golden-*.txt | sort
grep -hE "^FAILED|Error|passed|failed" "$D"/golden-*.txt
! grep -qE "failed|error" "$D"/golden-*.txt
