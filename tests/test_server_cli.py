"""`tightfit serve` and `tightfit chat` as a user runs them: subprocesses of the real CLI."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model_path():
    from tightfit.model.demo import demo_model_path
    return str(demo_model_path())


def test_serve_end_to_end(model_path):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tightfit.cli", "serve", "-m", model_path,
                             "--port", str(port), "-c", "256", "--api-key", "k", "--alias", "demo",
                             "--log-level", "warning"],
                            cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        seen = set()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 90:
            try:
                r = httpx.get(url + "/health", timeout=5)
                seen.add(r.status_code)
                if r.status_code == 200:
                    break
                assert r.status_code == 503 and r.json()["error"]["message"] == "Loading model"
            except httpx.TransportError:
                assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.1)
        assert 200 in seen, f"server never became ready: {seen}"
        h = {"Authorization": "Bearer k"}
        r = httpx.post(url + "/v1/chat/completions", headers=h, timeout=60,
                       json={"model": "demo", "messages": [{"role": "user", "content": "hi"}],
                             "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 3
        assert httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"] == "demo"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, proc.stderr.read()


def test_serve_bad_model_is_one_line_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    r = subprocess.run([sys.executable, "-m", "tightfit.cli", "serve", "-m", str(bad),
                        "--port", str(_free_port())], cwd=REPO, env=_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert "tightfit serve: error:" in r.stderr
    r = subprocess.run([sys.executable, "-m", "tightfit.cli", "serve", "-m", str(tmp_path / "missing.gguf")],
                       cwd=REPO, env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "not found" in r.stderr and "Traceback" not in r.stderr


def test_chat_command_uses_the_session_cache(model_path):
    r = subprocess.run([sys.executable, "-m", "tightfit.cli", "chat", "-m", model_path, "--temp", "0",
                        "-n", "8"], input="hi\nagain\n", cwd=REPO, env=_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    stats = [ln for ln in r.stderr.splitlines() if ln.startswith("[")]
    assert len(stats) == 2
    assert stats[0].startswith("[0 cached + ") and ", 8 generated" in stats[0]
    assert not stats[1].startswith("[0 cached")          # turn 2 reused turn 1's prefix


def test_chat_command_speculative_is_plain_greedy(model_path):
    """chat --spec: the same replies as plain greedy chat, the session cache still used, and each
    turn's speculative counters on a line of their own."""
    def chat(*extra):
        r = subprocess.run([sys.executable, "-m", "tightfit.cli", "chat", "-m", model_path, "--temp",
                            "0", "-n", "24", *extra], input="hi\nagain\n", cwd=REPO, env=_env(),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r
    plain, spec = chat(), chat("--spec", "ngram,suffix", "--draft-max", "4")
    assert spec.stdout == plain.stdout and plain.stdout.strip()
    stats = [ln for ln in spec.stderr.splitlines() if ln.startswith("[")]
    assert len(stats) == 4
    assert stats[0].startswith("[0 cached + ") and ", 24 generated" in stats[0]
    assert stats[1].startswith("[speculative: ") and stats[3].startswith("[speculative: ")
    assert not stats[2].startswith("[0 cached")
    assert "speculative" not in plain.stderr
