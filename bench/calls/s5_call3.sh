#!/bin/bash
# Session 5, device call 3: segment graphs (host rows), quantized-KV attention extras, 8 GiB decode, e2e.
exec bash bench/suite.sh 590 \
 "segtest|100|python3 -m pytest -q tests/test_segments.py 2>&1 | tail -15" \
 "kvbench|100|python3 bench/kv_quant.py --ctx 32768 --types f16,q8_0,tq3,tq4 --extras old,new --pdl 0,1 --pieces --out \$D" \
 "plan8g|230|python3 bench/plan_vram.py --budgets 8GiB --tokens 6 --profile-tokens 6 --profile-threads 0 --out \$D" \
 "e2e|110|TIGHTFIT_DEVICE_EMBED=1 python3 bench/e2e.py --tokens 64 --depths 0,32768 --out \$D" \
 "kvtest|60|python3 -m pytest -q -x tests/test_attn_decode_q_extras.py tests/test_kvquant_kernel.py 2>&1 | tail -8" \
 "plan8g_eager|80|TIGHTFIT_HOST_GRAPHS=0 python3 bench/plan_vram.py --budgets 8GiB --tokens 4 --profile-tokens 4 --profile-threads 0 --out \$D"
