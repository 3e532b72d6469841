"""Devices on any machine: names checked, GPU defaults, the pipeline's second device, and `make gpu-check`'s logic.

What needs a GPU to run is in tests/test_gpu.py; here a GPU's answers (is_available, device_count, bfloat16 support)
are stood in for, so the messages and choices are checked on a CPU-only machine too.
"""
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import ssd.models.devices
from ssd.bench import gpu_check, run as bench
from ssd import cli, commands
from ssd.models import loading as models
from ssd.models.devices import accelerator, drafter_device, resolve_device
from ssd.models.loading import load_pair
from ssd.models.tiny import tiny_pair
from ssd.pipeline.launch import Pipeline
from ssd.models.capability import accelerator_precision
from ssd.core.speculation import SSDConfig

CUDA = torch.device("cuda")


@pytest.fixture
def two_gpus(monkeypatch):
    """Stand in for a CUDA build that sees two GPUs with bfloat16."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Test GPU")


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(ssd.models.devices, "mps_available", lambda: False)


# ---- names ---------------------------------------------------------------------------------------------------------


def test_auto_picks_cuda_then_mps_then_the_cpu(monkeypatch, no_gpu):
    assert resolve_device("auto") == torch.device("cpu")
    monkeypatch.setattr(ssd.models.devices, "mps_available", lambda: True)
    assert resolve_device("auto") == torch.device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == CUDA and accelerator() == CUDA


def test_named_devices_come_back_as_torch_devices(two_gpus):
    assert resolve_device("cpu") == torch.device("cpu") and resolve_device(torch.device("cpu")) == torch.device("cpu")
    assert resolve_device("cuda") == CUDA and resolve_device(" cuda:1 ") == torch.device("cuda", 1)


@pytest.mark.parametrize("bad", ["gpu", "", None, "xla", "cuda:x"])
def test_an_unknown_device_names_the_parameter_and_the_choices(bad):
    with pytest.raises(ValueError, match=r"^draft_device must be one of auto, cpu, cuda, cuda:N or mps; got "):
        resolve_device(bad, "draft_device")


def test_a_device_that_is_not_here_says_why_in_one_line(monkeypatch, no_gpu):
    with pytest.raises(ValueError, match=r"device='cuda' but torch.cuda.is_available\(\) is False: this torch") as e:
        resolve_device("cuda")
    assert "\n" not in str(e.value)
    if torch.version.cuda is None:
        assert "is the CPU build" in str(e.value)
    with pytest.raises(ValueError, match=r"device='mps' but torch.backends.mps.is_available\(\) is False"):
        resolve_device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match=r"device='cuda:2' but this machine has 2 CUDA device\(s\): cuda:0 to cuda:1"):
        resolve_device("cuda:2")


def test_load_pair_checks_the_device_before_loading(no_gpu):
    with pytest.raises(ValueError, match="device='cuda' but torch.cuda.is_available"):
        load_pair("tiny", device="cuda")
    assert load_pair("tiny", device="auto", progress=False).target.device == torch.device("cpu")


# ---- precisions on a GPU -------------------------------------------------------------------------------------------


def test_a_gpu_runs_bfloat16_where_it_has_it_and_mps_float16(monkeypatch, two_gpus):
    assert accelerator_precision("cuda:0") == "bfloat16" and accelerator_precision("mps") == "float16"
    assert accelerator_precision("cpu") is None  # the CPU measures instead
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert accelerator_precision("cuda") == "float16"


def test_auto_on_a_gpu_decides_without_the_cpu_timing(monkeypatch, two_gpus):
    monkeypatch.setattr(models, "_auto", lambda *a: pytest.fail("auto timed the precisions on a GPU"))
    chosen = models._precisions("qwen2.5-coder", "auto", "auto", CUDA, progress=False)
    assert (chosen.target, chosen.draft) == ("bfloat16", "bfloat16") and "auto on cuda (Test GPU; the GPU" in chosen.reason
    mixed = models._precisions("qwen2.5-coder", "auto", "float32", CUDA, progress=False)
    assert (mixed.target, mixed.draft) == ("bfloat16", "float32")


def test_int8_on_a_gpu_fails_in_one_line(monkeypatch, two_gpus):
    with pytest.raises(ValueError, match="^draft_dtype=int8 is not supported on cuda: int8 runs on CPUs only"):
        load_pair("tiny", draft_dtype="int8", device="cuda")
    monkeypatch.setattr(ssd.models.devices, "mps_available", lambda: True)
    with pytest.raises(ValueError, match="^draft_dtype=int8 is not supported on mps"):
        load_pair("tiny", draft_dtype="int8", device="mps")


# ---- the pipeline's second device ----------------------------------------------------------------------------------


def test_the_drafter_takes_the_next_gpu_or_says_there_is_none(monkeypatch, two_gpus):
    assert drafter_device(torch.device("cpu")) == torch.device("cpu")
    assert drafter_device(torch.device("mps")) == torch.device("cpu")
    assert drafter_device(torch.device("cuda", 0)) == torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"the pipeline needs a second GPU for its drafter: the verifier is on cuda:0 "
                                         r"and this machine has 1 CUDA device\(s\); give draft_device='cpu'"):
        drafter_device(torch.device("cuda", 0))
    assert drafter_device(torch.device("cuda", 0), spawned=False) == torch.device("cuda", 1)  # torchrun: elsewhere


def test_a_pipeline_draft_device_that_is_not_here_fails_before_a_drafter_starts(no_gpu):
    with pytest.raises(ValueError, match="draft_device='cuda:1' but torch.cuda.is_available"):
        Pipeline(tiny_pair(), draft_device="cuda:1")
    assert not ssd.pipeline.launch.open_pipelines()


def test_the_cli_refuses_a_missing_gpu_and_a_one_gpu_pipeline_before_loading(monkeypatch, capsys, no_gpu):
    assert cli.main(["bench", "--pair", "tiny", "--device", "cuda", "--methods", "ar,sd"]) == 2  # load_pair's check
    assert "error: device='cuda' but torch.cuda.is_available() is False" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(commands, "load", lambda args: pytest.fail("loaded a pair"))
    assert cli.main(["bench", "--pair", "tiny", "--device", "cuda", "--methods", "ar,ssd-pipeline"]) == 2
    assert "the pipeline needs a second GPU" in capsys.readouterr().err


@pytest.mark.parametrize("device, forward, tokens", [("cpu", "eager", 8), ("cuda", "eager", 64),
                                                     ("cpu", "compiled", 64)])
def test_the_bench_warms_a_gpu_or_compiled_forwards_up_over_a_whole_answer(monkeypatch, device, forward, tokens):
    """A GPU loads kernels at first use and picks them by shape, and compiled forwards make a graph for a shape at its
    first use: a short warm-up left their cost in the first answer."""
    calls = []
    monkeypatch.setattr(bench, "run_batch", lambda method, pair, contexts, config, seed, autotune=None: calls.append(
        (method, len(contexts), config.max_new_tokens)))
    pair = SimpleNamespace(target=SimpleNamespace(device=torch.device(device)), forward=forward)
    bench.warm_up(pair, [[1, 2], [3]], ["ar", "sd:batch_size=2"], SSDConfig(max_new_tokens=64))
    assert calls == [("ar", 1, tokens), ("sd:batch_size=2", 2, tokens)]


# ---- make gpu-check ------------------------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.skipif(accelerator() is not None, reason="this machine has a GPU: gpu-check would run")
def test_gpu_check_stops_at_once_without_a_gpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    done = subprocess.run([sys.executable, "-m", "ssd", "gpu-check", "--json", str(out)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and not out.exists()
    assert done.stderr.strip().splitlines() == [gpu_check.no_gpu_message()]
    assert "no GPU here: torch.cuda.is_available() is False" in done.stderr


def fake_bench(rows, sd_over_hf_sd) -> dict:
    return {"rows": rows, "summary": [{"method": "sd", "speedup_vs_peer": sd_over_hf_sd}], "categories": []}


def fake_step(benches: dict, seconds: float = 30.0, tests_tail: str = "7 passed, 2 skipped in 9.1s"):
    """Stands in for gpu_check.execute: records each command; a bench writes benches[its precision] as its JSON."""
    commands = []

    def step(command, timeout_s):
        commands.append(command)
        if "bench" in command:
            precision = command[command.index("--target-dtype") + 1]
            with open(command[command.index("--json") + 1], "w") as f:
                json.dump(benches[precision], f)
        if "profile_shapes" in " ".join(command):
            with open(command[-1], "w") as f:
                json.dump(SHAPES, f)
        tail = [tests_tail] if "pytest" in command else []
        return {"command": " ".join(command), "returncode": 0, "timed_out": False, "seconds": seconds,
                "output_tail": tail}

    return step, commands


SAME = {"identical_to_target": True}
SHAPES = {"pair": "qwen2.5-coder (random weights)", "k": 4, "rows": [
    {"batch_size": 1, "v": 1.02, "c": 0.61, "sd_speedup": {"0.9": 1.3}},
    {"batch_size": 64, "v": 2.5, "c": 0.4, "sd_speedup": {"0.9": 0.9}}]}


@pytest.fixture(autouse=True)
def pair_installed(monkeypatch):
    """gpu-check as where the offline pair's packages are installed (make install), whatever this machine holds."""
    monkeypatch.setattr(gpu_check, "pair_missing", lambda: None)


def test_gpu_check_writes_its_record_from_the_steps(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "device_name", lambda device: "Test GPU")
    monkeypatch.setattr(gpu_check, "accelerator_precision", lambda device: "bfloat16")
    near = {"identical_to_target": False, "prompt_id": "HumanEval/3", "method": "sd", "first_difference": 17,
            "margin_at_difference": 0.125, "near_tie": True}
    step, commands = fake_step({"float32": fake_bench([SAME] * 3, 1.05), "bfloat16": fake_bench([SAME, near], 1.2)})
    out, lines = tmp_path / "data" / "gpu_check.json", []
    assert gpu_check.run(str(out), device=CUDA, gpus=2, step=step, say=lines.append) == 0
    record = json.loads(out.read_text())
    assert record["gpu"] == "Test GPU" and record["gpus"] == 2 and record["passed"] is True
    assert record["greedy_identical_float32"] is True and record["near_ties_reduced"] is True
    assert record["differences_reduced"] == [{k: near[k] for k in record["differences_reduced"][0]}]
    assert record["sd_over_hf_sd"] == {"float32": 1.05, "bfloat16": 1.2}
    benches = [c for c in commands if "bench" in c]
    assert [c[c.index("--methods") + 1] for c in benches] == ["ar,hf-ar,sd,hf-sd,ssd,ssd-pipeline"] * 2
    assert "humaneval:8" in benches[0] and "64" in benches[0] and ["--temperature", "0", "-k", "4"] == benches[0][
        benches[0].index("--temperature"):benches[0].index("-k") + 2]
    assert lines[-1].startswith("passed: float32 identical to AR True") and not list(out.parent.glob(".tmp-*"))
    assert record["bench_pair"] == "qwen2.5-coder" and all(c[c.index("--pair") + 1] == "qwen2.5-coder" for c in benches)
    assert record["shapes"]["result"] == SHAPES
    assert "v at K = 4: 1.02 (b 1), 2.50 (b 64); c: 0.61 (b 1)" in " ".join(lines)
    shapes = next(c for c in commands if "profile_shapes" in " ".join(c))
    assert "'cuda', 'bfloat16'" in " ".join(shapes)  # at the GPU's precision


def test_gpu_check_without_the_pairs_packages_benches_the_tiny_pair(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "device_name", lambda device: "Test GPU")
    monkeypatch.setattr(gpu_check, "pair_missing", lambda: "part package 'x' is not installed")
    step, commands = fake_step({p: fake_bench([SAME], 1.0) for p in ("float32", "bfloat16", "float16")})
    out = tmp_path / "gpu_check.json"
    assert gpu_check.run(str(out), device=CUDA, gpus=1, step=step, say=lambda line: None) == 0
    record = json.loads(out.read_text())
    assert record["bench_pair"] == "tiny" and "not installed; the benches run on the 'tiny' pair" in record["weights"][
        "skipped"]
    assert not any("ensure_cached" in " ".join(c) for c in commands)
    assert all(c[c.index("--pair") + 1] == "tiny" for c in commands if "bench" in c)
    assert record["shapes"]["result"] == SHAPES  # the pair's shapes are profiled all the same


def test_gpu_check_skips_the_profiles_where_they_would_not_fit(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "device_name", lambda device: "Test GPU")
    step, commands = fake_step({p: fake_bench([SAME], 1.0) for p in ("float32", "bfloat16", "float16")}, seconds=5.0)
    out = tmp_path / "gpu_check.json"
    assert gpu_check.run(str(out), budget_s=50, device=CUDA, gpus=1, step=step, say=lambda line: None) == 0
    assert "it would not fit" in json.loads(out.read_text())["shapes"]["skipped"]
    assert not any("profile_shapes" in " ".join(c) for c in commands)


def test_gpu_check_fails_where_the_profiles_failed(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "device_name", lambda device: "Test GPU")
    step, _ = fake_step({p: fake_bench([SAME], 1.0) for p in ("float32", "bfloat16", "float16")})

    def no_profiles(command, timeout_s):
        record = step(command, timeout_s)
        return record | {"returncode": 1} if "profile_shapes" in " ".join(command) else record

    out = tmp_path / "gpu_check.json"
    assert gpu_check.run(str(out), device=CUDA, gpus=1, step=no_profiles, say=lambda line: None) == 1
    assert json.loads(out.read_text())["shapes"]["result"] is None


def test_gpu_check_skips_what_would_not_fit_and_fails_on_a_float32_difference(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "device_name", lambda device: "Test GPU")
    differ = {"identical_to_target": False, "near_tie": None}
    step, commands = fake_step({"float32": fake_bench([SAME, differ], 0.9)}, seconds=400.0)
    out = tmp_path / "gpu_check.json"
    assert gpu_check.run(str(out), budget_s=300, device=CUDA, gpus=1, step=step, say=lambda line: None) == 1
    record = json.loads(out.read_text())
    reduced = [p for p in record["benches"] if p != "float32"]
    assert "would not fit: float32's took 400 s" in record["benches"][reduced[0]]["skipped"]
    assert record["greedy_identical_float32"] is False and record["passed"] is False
    assert all("ssd-pipeline" not in c for c in commands)  # one GPU: no pipeline in the bench


def test_gpu_check_fails_where_the_gpu_tests_did_not_run(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "device_name", lambda device: "Test GPU")
    step, _ = fake_step({p: fake_bench([SAME], 1.0) for p in ("float32", "bfloat16", "float16")},
                        tests_tail="11 skipped in 3.9s")
    out = tmp_path / "gpu_check.json"
    assert gpu_check.run(str(out), device=CUDA, gpus=1, step=step, say=lambda line: None) == 1
    assert json.loads(out.read_text())["greedy_identical_float32"] is True  # only the tests were missing
