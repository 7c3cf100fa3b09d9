#!/bin/bash
# One device call, several bench steps, each under its own timeout and a global deadline.
#   bash bench/suite.sh DEADLINE_S "name|timeout_s|command" ...
# Each step's command sees $D (its own results folder). Logs and results are packed into
# $OUT/results.tgz (the device returns at most 8 files); the Triton cache is kept in .tcache
# (carry it in the next call: compilation is most of a cold start) and returned as
# $OUT/tcache.tgz. Wheels in .whl are installed first (scripts/prepare_device_wheels.sh).
set -u
T0=$(date +%s); DEADLINE=$1; shift
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >/dev/null 2>&1 || echo "wheel install failed"
export PYTHONPATH=/tmp/site:${PYTHONPATH:-} PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$PWD/.tcache
# cupy's NVRTC binaries travel with the Triton cache (the GEMV modules compile once, not per call)
export CUPY_CACHE_DIR=$PWD/.tcache/cupy
mkdir -p .tcache "$OUT/res"
if ls .tcache_in/tcache.tgz* >/dev/null 2>&1; then cat .tcache_in/tcache.tgz* | tar xzf - 2>/dev/null; fi
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem --format=csv,noheader
SUMMARY=""
for step in "$@"; do
  name=${step%%|*}; rest=${step#*|}; t=${rest%%|*}; cmd=${rest#*|}
  left=$(( DEADLINE - ($(date +%s) - T0) - 25 ))
  if [ $left -lt 20 ]; then SUMMARY+="$name: SKIPPED (deadline)"$'\n'; continue; fi
  [ $t -gt $left ] && t=$left
  export D=$OUT/res/$name; mkdir -p "$D"
  s=$(date +%s)
  # pipefail: "pytest ... | tail" reports pytest's status, not tail's (session 6 lost a result so)
  timeout -k 5 $t bash -o pipefail -c "$cmd" > "$D/log.txt" 2>&1; rc=$?
  el=$(( $(date +%s) - s ))
  echo "===== $name rc=$rc ${el}s (limit ${t}s)"; tail -n 30 "$D/log.txt" | cut -c1-220
  SUMMARY+="$name: rc=$rc ${el}s"$'\n'
done
tar czf "$OUT/results.tgz" -C "$OUT" res && rm -rf "$OUT/res"
python3 scripts/prune_triton_cache.py .tcache
# the device returns files of at most 16 MiB: the cache comes back in 15 MiB parts
tar czf - .tcache 2>/dev/null | split -b 15m - "$OUT/tcache.tgz.part-"
ls -la "$OUT"
echo "===== summary (total $(( $(date +%s) - T0 ))s)"; printf "%s" "$SUMMARY"
