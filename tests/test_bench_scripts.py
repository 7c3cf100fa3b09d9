"""Device benchmark scripts run once per device session; a script that no longer starts wastes the
scarce device minutes. Each must at least parse its arguments (and import what it needs at module
level) on a CPU machine."""
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = sorted((Path(__file__).resolve().parents[1] / "bench").glob("*.py"))


@pytest.mark.parametrize("script", BENCH, ids=[p.name for p in BENCH])
def test_bench_script_starts(script):
    r = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "usage" in r.stdout.lower()
