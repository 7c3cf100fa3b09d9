#!/bin/bash
# Next session, device call 2 (27B seed mix, generated on the device): whole-step A/Bs for issue 7.
exec bash bench/suite.sh 590 \
 "pdl_ab|330|TIGHTFIT_DEVICE_EMBED=1 python3 bench/pdl_ab.py --depths 0,32768 --tokens 64 --out \$D" \
 "merge_ab|120|TIGHTFIT_DEVICE_EMBED=1 python3 tests/test_merge_linears.py --path /tmp/seedmix.gguf --tokens 16 --steps 128" \
 "e2e_all|100|TIGHTFIT_DEVICE_EMBED=1 TIGHTFIT_PDL=1 TIGHTFIT_MERGE_LINEARS=1 python3 bench/e2e.py --tokens 64 --depths 0,32768 --out \$D"
