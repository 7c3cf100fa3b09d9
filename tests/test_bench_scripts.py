"""Device benchmark scripts run once per device session; a script that no longer starts wastes the
scarce device minutes. Each must at least parse its arguments (and import what it needs at module
level) on a CPU machine."""
import subprocess
import sys
from pathlib import Path

import pytest

# scripts only: bench/_*.py are helper modules the scripts import
BENCH = sorted(p for p in (Path(__file__).resolve().parents[1] / "bench").glob("*.py")
               if not p.name.startswith("_"))


@pytest.mark.parametrize("script", BENCH, ids=[p.name for p in BENCH])
def test_bench_script_starts(script):
    r = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "usage" in r.stdout.lower()


def test_server_stream_cpu_smoke(tmp_path):
    """bench/server_stream.py end to end on the CPU demo model: direct decode, a live uvicorn, one
    streamed chat request, and the JSON report."""
    import json
    script = Path(__file__).resolve().parents[1] / "bench" / "server_stream.py"
    r = subprocess.run([sys.executable, str(script), "--device", "cpu", "--tokens", "12", "--reps", "1",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "server_stream.json").read_text())
    assert res["direct_tok_s"] > 0 and res["stream_tok_s"] > 0 and res["ratio_best"] > 0
    assert res["same_token_count"] and res["stream"][0]["tokens"] == res["direct"][0]["tokens"]
    assert "ratio best" in r.stdout


def test_profile8g_cpu_smoke(tmp_path):
    """bench/profile8g.py end to end on a 4-layer 'small' ternary file on the CPU: generate,
    repack (T3), prune, plan under 8 GiB with the tq3 cache, load, fill the KV, decode."""
    script = Path(__file__).resolve().parents[1] / "bench" / "profile8g.py"
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(script), "--device", "cpu", "--layers", "4",
                        "--depths", "0,512", "--tokens", "2", "--dir", str(tmp_path / "models"),
                        "--out", str(out), "--budget-s", "240"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    import json
    res = json.loads((out / "profile8g.json").read_text())
    runs = {x["variant"]: x for x in res["runs"]}
    assert set(runs) == {"tq2", "t3", "pruned"}, r.stdout[-3000:]
    for v, x in runs.items():
        assert x.get("kv_type") == "tq3", (v, x.get("attempts"))
        assert x["bill"]["fits"] and x["bill"]["kv_cache"] > 0
        for d in ("0", "512"):
            assert x["depth"][d]["tok_s"] > 0, (v, x["depth"][d])
    assert runs["t3"]["file_bytes"] < runs["tq2"]["file_bytes"]
    assert "8 GB profile" in r.stdout


def test_ternary_gemv_cpu_smoke(tmp_path):
    """bench/ternary_gemv.py --device cpu: the correctness check (T3 and TQ2_0 on the same
    ternary weights vs float64) under the Triton interpreter at a tiny shape."""
    script = Path(__file__).resolve().parents[1] / "bench" / "ternary_gemv.py"
    r = subprocess.run([sys.executable, str(script), "--device", "cpu", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    import json
    res = json.loads((tmp_path / "ternary_gemv.json").read_text())
    checks = [x for x in res["results"] if x["kind"] == "check"]
    assert {x["type"] for x in checks} >= {"T3_256", "TQ2_0"}
    assert all(x["ok"] for x in checks), checks
