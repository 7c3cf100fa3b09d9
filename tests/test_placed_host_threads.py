"""placed.passive_host_threads (issue 5): with host rows, numba's pool waits passively unless the
user chose. Each case runs in a fresh interpreter (the policy only applies before numba starts its
threading layer, which this test process may already have done); the layer actually started and
the variable libgomp saw are read back from numba and the C environment, not from the code under
test."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROG = r"""
import ctypes, json, os, sys
import numpy as np, numba
from tightfit.model import placed as P
first = P.passive_host_threads()
from tightfit.kernels import cpu_gemv
w = np.zeros((8, 34), np.uint8)                  # 8 Q8_0 rows of 32 (zero scales)
cpu_gemv.gemv(w, 8, np.ones(32, np.float32))     # starts the threading layer
libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p
v = libc.getenv(b"OMP_WAIT_POLICY")
print(json.dumps({"first": first, "again": P.passive_host_threads(),
                  "layer": numba.threading_layer(), "c_env": v.decode() if v else None}))
"""


def _run(**env) -> dict:
    """The PROG's JSON, plus `spin`: GOMP_SPINCOUNT as the LAST libgomp loaded displayed it at
    its start (OMP_DISPLAY_ENV=VERBOSE; torch may bring its own libgomp, shown first): '0' is
    passive waiting in the OpenMP runtime numba's omp layer started."""
    e = {k: v for k, v in os.environ.items()
         if k not in ("OMP_WAIT_POLICY", "NUMBA_THREADING_LAYER", "NUMBA_THREADING_LAYER_PRIORITY",
                      "TIGHTFIT_HOST_PASSIVE")}
    e.update(env)
    e["OMP_DISPLAY_ENV"] = "VERBOSE"
    r = subprocess.run([sys.executable, "-c", PROG], env=e, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    spins = [ln.split("=")[1].strip().strip("'") for ln in (r.stdout + r.stderr).splitlines()
             if ln.strip().startswith("GOMP_SPINCOUNT")]
    out["spin"] = spins[-1] if spins else None
    return out


def _has_omp() -> bool:
    try:
        from numba.np.ufunc import omppool  # noqa: F401
        return True
    except ImportError:
        return False


def test_default_passive_and_omp():
    got = _run()
    assert got["first"] is True and got["again"] is False     # too late once the pool runs
    assert got["c_env"] == "PASSIVE"
    if _has_omp():
        assert got["layer"] == "omp"
        assert got["spin"] == "0"                  # libgomp took the policy when numba loaded it


def test_user_choice_respected():
    got = _run(OMP_WAIT_POLICY="ACTIVE", NUMBA_THREADING_LAYER="workqueue")
    assert got["first"] is False
    assert got["c_env"] == "ACTIVE" and got["layer"] == "workqueue"


def test_switch_off():
    got = _run(TIGHTFIT_HOST_PASSIVE="0")
    assert got["first"] is False and got["c_env"] is None
    if got["layer"] == "omp":
        assert got["spin"] not in (None, "0")      # libgomp's default: spin, then sleep


@pytest.mark.skipif(not _has_omp(), reason="numba's omp layer is not available")
def test_policy_alone_when_layer_chosen():
    got = _run(NUMBA_THREADING_LAYER="omp")
    assert got["first"] is True and got["c_env"] == "PASSIVE" and got["layer"] == "omp"
    assert got["spin"] == "0"
