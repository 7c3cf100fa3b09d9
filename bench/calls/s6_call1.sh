#!/bin/bash
# Next session, device call 1 (no 27B model): correctness of what session 5 built without the device,
# then kernel-level A/Bs. See bench/NOTES.md "Next device run".
exec bash bench/suite.sh 590 \
 "segtest|200|python3 -m pytest -q tests/test_segments.py 2>&1 | tail -15" \
 "pdltest|120|python3 -m pytest -q tests/test_pdl_device.py tests/test_pdl_triton.py 2>&1 | tail -15" \
 "kvtest|60|python3 -m pytest -q -x tests/test_attn_decode_q_extras.py tests/test_kvquant_kernel.py 2>&1 | tail -8" \
 "kvbench|40|python3 bench/kv_quant.py --ctx 32768 --types f16,q8_0,tq3 --extras new --pdl 0,1 --pieces --xcfg ';msplit=1' --out \$D" \
 "pdlbench|60|PYTHONPATH=.:\$PYTHONPATH python3 tests/test_pdl_device.py --bench" \
 "mmatest|60|python3 -m pytest -q -x tests/test_gemv_mma_device.py 2>&1 | tail -8"
