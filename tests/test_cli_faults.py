"""Faults reach the command line as one `error:` line and a non-zero exit: a model that cannot be loaded (exit 2,
like any bad input) and a pipeline whose drafter dies (exit 1), never a traceback."""
import os
import signal
import subprocess
import sys
import time

import pytest

import ssd.models.loading
from ssd.cli import main
from ssd.pipeline.transport import PipelineError


def test_a_model_that_cannot_be_loaded_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(ssd.models.loading, "_hub_reachable", lambda: False)  # as on a machine without the hub
    argv = ["generate", "--pair", "no-such-org/draft,no-such-org/target", "--prompt", "x",
            "--target-dtype", "float32", "--draft-dtype", "float32"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: pair: could not load model 'no-such-org/draft'")
    assert "offline default pair is 'qwen2.5-coder'" in err[0]


def test_a_pipeline_fault_prints_its_cause_alone(monkeypatch, capsys):
    message = ("ssd-pipeline: the link to the other rank broke while sending the verdicts of round 3; the drafter "
               "raised:\nTraceback (most recent call last):\n  File \"x.py\", line 1, in draft\nRuntimeError: out of "
               "memory")

    def fault(*args):
        raise PipelineError(message)

    monkeypatch.setattr("ssd.commands.cmd_models", fault)
    assert main(["models"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: ssd-pipeline: the link to the other rank broke while sending the verdicts of round 3; the "
                   "drafter raised: RuntimeError: out of memory"]


def drafter_of(pid: int, timeout_s: float = 60) -> int:
    """The pid of the drafter a bench process spawned, once it exists: its child started by multiprocessing's spawn
    (the other child, multiprocessing's resource tracker, runs resource_tracker's main instead)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for child in children(pid):
            try:
                with open(f"/proc/{child}/cmdline", "rb") as f:
                    if b"spawn_main" in f.read():
                        return child
            except OSError:  # it ended between the listing and the read
                continue
        time.sleep(0.2)
    pytest.fail(f"the bench (pid {pid}) spawned no drafter within {timeout_s} s")


def children(pid: int) -> list[int]:
    path = f"/proc/{pid}/task/{pid}/children"
    with open(path) as f:
        return [int(c) for c in f.read().split()]


@pytest.mark.integration
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the drafter through /proc (Linux)")
def test_killing_the_drafter_mid_bench_is_one_line_and_exit_1(tmp_path):
    argv = [sys.executable, "-m", "ssd", "bench", "--pair", "tiny", "--methods", "ssd-pipeline", "--prompts",
            "humaneval:40", "--max-new-tokens", "64", "--verifier-cores", "0", "--drafter-cores", "0"]
    bench = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        drafter = drafter_of(bench.pid)
        time.sleep(3)  # mid-bench: the drafter loaded and serving rounds
        os.kill(drafter, signal.SIGKILL)
        _, err = bench.communicate(timeout=60)
    finally:
        bench.kill()
    errors = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("error:")]
    assert bench.returncode == 1
    assert len(errors) == 1 and f"the drafter process (pid {drafter}) was killed by signal 9" in errors[0]
    assert "Traceback" not in err and "[rank0]" not in err
