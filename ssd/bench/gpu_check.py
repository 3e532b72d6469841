"""`make gpu-check` (`python -m ssd gpu-check`): the kit on a GPU, one prepared run of at most 8 minutes.

1. Where this torch sees neither CUDA nor Apple's MPS it stops at once, before anything is loaded or written.
2. The tests marked ``gpu`` (tests/test_gpu.py): greedy SD, SSD and the peers identical to AR in float32 on the
   device, the bfloat16 near-tie rule, the tree mask against branch-by-branch drafting, Saguaro's output distribution,
   and the pipeline across two GPUs where there are two.
3. The offline pair's float32 weight cache, built if missing (its own step, so the benches' times are their own).
   Where the pair's part packages are not installed (a GPU machine that reaches no registry), this step is skipped,
   said, and the benches run on the tiny random pair: the code paths and the losslessness checks, not the speed.
4. A short bench, each in its own process: ar, hf-ar, sd, hf-sd and ssd (and ssd-pipeline with two GPUs) on 8
   HumanEval prompts x 64 tokens, greedy, K = 4, in float32 (every output must be the target's), then at the GPU's
   default precision (bfloat16; float16 where the GPU lacks it, and on MPS), where every difference from AR must sit
   at a near-tie of the target's top two logits; skipped, and said, if it would not fit in what is left of the time.
5. The offline pair's latency profile at the GPU's precision and batch sizes 1 to 64, in its shapes with random
   weights (``ssd.models.shapes``: a pass's time depends on the shapes, not the values), so it is measured even where
   the weights are not: a verify pass over b x (K + 1) tokens in one-token steps (v), a draft step over a target step
   (c), and SD's speed-up E / (cK + v) these give at a few acceptance rates. On CUDA, the same passes on a static
   cache, eager and replayed from a CUDA graph (``ssd.bench.graphs``): how much of a step is the host launching kernels.
6. data/<the GPU>/gpu_check.json (data/nvidia-h200/...), written under a temporary name and renamed: the GPU's name, the versions, each step's outcome
   and time, the bench results, the profiles, and the headline checks. The exit status is 0 only if every check held.

It installs nothing: the README's set-up (`make install`) is all it needs; without the pair's packages or the notebook
packages it still runs (step 3).
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

import torch

from ..models.devices import accelerator, why_no_cuda
from ..files import KIT_ROOT, write_json
from ..models.gguf_store import ModelPartError, part_paths
from ..models.loading import PAIRS
from ..names import GPU_CHECK_BUDGET_S, GPU_CHECK_OUT, TINY_PAIR
from ..models.capability import accelerator_precision, device_name, kind_of, kind_slug

TESTS_S = 180.0  # the gpu tests take well under a minute on a GPU; this bounds a hang
TESTS = KIT_ROOT / "tests" / "test_gpu.py"
PAIR = "qwen2.5-coder"
METHODS = ["ar", "hf-ar", "sd", "hf-sd", "ssd"]
BENCH = ["--prompts", "humaneval:8", "--max-new-tokens", "64", "--temperature", "0", "-k", "4", "--seed", "0"]
TAIL = 20  # lines of a step's output kept in the record
SHAPES_S = 300.0  # the profiles take about a minute on a GPU; this bounds a hang
SHAPES_MIN_S = 60.0  # with less left than this the profiles are skipped, and said
SHAPE_BATCHES = (1, 4, 16, 64)
SHAPE_K = 4  # the draft length v and SD's speed-up are given at
SHAPE_ACCEPTANCE = (0.6, 0.8, 0.9)  # about prose, between, code (the offline pair's greedy agreement, MODELS.md)


def no_gpu_message() -> str:
    return (f"gpu-check: no GPU here: torch.cuda.is_available() is False ({why_no_cuda()}) and "
            "torch.backends.mps.is_available() is False; run it on a machine with an NVIDIA GPU (or Apple Silicon) "
            "after `make install`. Nothing was run or written.")


def execute(command: list[str], timeout_s: float) -> dict:
    """Run one step in its own process group; on timeout the whole group (a pipeline's drafter too) is killed."""
    start = time.monotonic()
    env = os.environ | {"TQDM_DISABLE": "1"}
    process = subprocess.Popen(command, cwd=KIT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=max(timeout_s, 1.0))
        returncode, timed_out = process.returncode, False
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        returncode, timed_out = None, True
    return {"command": " ".join(command), "returncode": returncode, "timed_out": timed_out,
            "seconds": round(time.monotonic() - start, 1), "output_tail": (output or "").splitlines()[-TAIL:]}


class Clock:
    def __init__(self, budget_s: float):
        self.start, self.budget_s = time.monotonic(), budget_s

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.budget_s - self.elapsed()


def bench_methods(device: torch.device, gpus: int) -> list[str]:
    return METHODS + (["ssd-pipeline"] if device.type == "cuda" and gpus >= 2 else [])


def pair_missing() -> str | None:
    """None where the offline pair's part packages are installed; else why they are not (the first one missing)."""
    try:
        for spec in (PAIRS[PAIR].draft, PAIRS[PAIR].target):
            part_paths(spec)
    except ModelPartError as e:
        return str(e)
    return None


def step_with_json(run, command: list[str], timeout_s: float) -> dict:
    """run(command + [a temporary JSON path]); the step's record with that JSON under "result" (None if it failed)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "result.json"
        step = run(command + [str(path)], timeout_s)
        step["result"] = json.loads(path.read_text()) if step["returncode"] == 0 and path.is_file() else None
    return step


def bench_step(run, python: str, device, precision: str, methods: list[str], timeout_s: float, pair: str) -> dict:
    """One bench in its own process."""
    command = [python, "-m", "ssd", "bench", "--device", str(device), "--pair", pair, "--methods", ",".join(methods),
               *BENCH, "--target-dtype", precision, "--draft-dtype", precision, "--json"]
    return step_with_json(run, command, timeout_s)


def shapes_step(run, python: str, device, precision: str, timeout_s: float) -> dict:
    """The profiles of the pair's shapes (profile_shapes) in their own process."""
    code = ("import sys; from ssd.bench.gpu_check import profile_shapes; "
            f"profile_shapes({str(device)!r}, {precision!r}, sys.argv[1])")
    return step_with_json(run, [python, "-c", code], timeout_s)


def profile_shapes(device: str, precision: str, out: str, batches=SHAPE_BATCHES) -> None:
    """The offline pair's profile in its shapes with random weights at each batch size, summed up into JSON at out."""
    from . import profile
    from ..models.shapes import random_pair
    from ..core.theory import expected_tokens, sd_from_profile

    pair = random_pair(PAIR, target_dtype=precision, draft_dtype=precision, device=device)
    rows = []
    for b in batches:
        measured = profile.measure(pair, batch_size=b, progress=False)
        sd = {str(a): sd_from_profile(measured, SHAPE_K, expected_tokens(a, SHAPE_K)) for a in SHAPE_ACCEPTANCE}
        first = next(iter(sd.values()))
        rows.append({"batch_size": b, "target_step_ms": measured.target_at(1), "draft_step_ms": measured.draft_at(1),
                     "c": first["profile_c"], "v": first["profile_v"],
                     "sd_speedup": {a: s["profile_speedup_vs_ar"] for a, s in sd.items()},
                     "target_floor_ms": measured.floor_ms("target"), "profile": measured.to_dict()}
                    | ({"graphs": graph_steps(pair, b)} if torch.device(device).type == "cuda" else {}))
    write_json(out, {"pair": pair.name, "precisions": pair.precisions.as_dict(), "k": SHAPE_K, "rows": rows})


def graph_steps(pair, b: int) -> dict:
    """The target's step and verify pass and the draft's step over b rows on a static cache, eager and replayed from
    a CUDA graph (ssd.bench.graphs), with the c and v and SD's speed-up that the replayed passes would give."""
    from .graphs import pass_ms
    from ..core.theory import sd_speedup

    ms = {}
    for mode in ("eager", "graph"):
        graph = mode == "graph"
        ms[mode] = {"target_1": pass_ms(pair.target, b, 1, graph=graph),
                    f"target_{SHAPE_K + 1}": pass_ms(pair.target, b, SHAPE_K + 1, graph=graph),
                    "draft_1": pass_ms(pair.draft, b, 1, graph=graph)}
    replayed = ms["graph"]
    c, v = replayed["draft_1"] / replayed["target_1"], replayed[f"target_{SHAPE_K + 1}"] / replayed["target_1"]
    return {"static_cache_ms": ms, "c": c, "v": v,
            "sd_speedup": {str(a): sd_speedup(a, SHAPE_K, c, v) for a in SHAPE_ACCEPTANCE}}


def verdicts(benches: dict) -> dict:
    """The headline checks from the benches' rows: float32 identical to AR throughout, every reduced-precision
    difference at a near-tie, and our SD over transformers' assisted generation at each precision."""
    out = {"greedy_identical_float32": None, "near_ties_reduced": None, "differences_reduced": None,
           "sd_over_hf_sd": {}}
    for precision, step in benches.items():
        result = step.get("result")
        if not result:
            continue
        rows = result["rows"]
        sd = next((s for s in result["summary"] if s["method"] == "sd"), {})
        out["sd_over_hf_sd"][precision] = sd.get("speedup_vs_peer")
        if precision == "float32":
            out["greedy_identical_float32"] = all(r["identical_to_target"] for r in rows)
        else:
            differ = [r for r in rows if not r["identical_to_target"]]
            out["differences_reduced"] = [{k: r.get(k) for k in ("prompt_id", "method", "first_difference",
                                                                  "margin_at_difference", "near_tie")} for r in differ]
            out["near_ties_reduced"] = all(r.get("near_tie") is True for r in differ)
    return out


def passed(record: dict) -> bool:
    """Every check held: the gpu tests ran (some passed, none failed), the float32 bench gave the target's tokens
    throughout, and the reduced-precision bench, unless skipped for time, differed only at near-ties."""
    tests, benches = record["tests"], record["benches"]
    ran = tests["returncode"] == 0 and " passed" in " ".join(tests.get("output_tail", [])[-1:])
    reduced_ok = all(step.get("skipped") or (step.get("result") and record["near_ties_reduced"])
                     for precision, step in benches.items() if precision != "float32")
    weights_ok = record["weights"].get("skipped") or record["weights"]["returncode"] == 0
    return bool(ran and weights_ok and benches["float32"].get("result") and record["greedy_identical_float32"]
                and reduced_ok and (record["shapes"].get("skipped") or record["shapes"].get("result")))


def header(device: torch.device, gpus: int) -> dict:
    import transformers

    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": str(device),
            "gpu": device_name(device), "gpus": gpus, "torch": torch.__version__, "cuda": torch.version.cuda,
            "transformers": transformers.__version__, "python": sys.version.split()[0]}


def run(out: str = GPU_CHECK_OUT, budget_s: float = GPU_CHECK_BUDGET_S, *, device: torch.device | None = None,
        gpus: int | None = None, step=execute, python: str = sys.executable,
        say=lambda line: print(f"gpu-check: {line}", file=sys.stderr, flush=True)) -> int:
    """The whole check; returns the exit status (0: every check held; 1: one failed; 2: no GPU here)."""
    device = device or accelerator()
    if device is None:
        print(no_gpu_message(), file=sys.stderr)
        return 2
    gpus = torch.cuda.device_count() if gpus is None and device.type == "cuda" else gpus or 1
    clock = Clock(budget_s)
    record = header(device, gpus) | {"budget_s": budget_s}
    say(f"{record['gpu']} ({gpus} device(s)), torch {record['torch']}; at most {budget_s:.0f} s")

    if TESTS.is_file():
        # -p no:nbval: the notebook plugin is not needed here, and a GPU machine's python may lack nbformat
        tests = [python, "-m", "pytest", "-m", "gpu", str(TESTS), "-q", "-p", "no:cacheprovider", "-p", "no:nbval"]
        record["tests"] = step(tests, min(TESTS_S, clock.left()))
    else:
        record["tests"] = {"returncode": None, "skipped": f"{TESTS} is not here (run from a clone of the kit)"}
    say(f"gpu tests: {_outcome(record['tests'])}")

    missing = pair_missing()
    if missing:
        record["weights"] = {"returncode": None, "skipped": f"{missing}; the benches run on the {TINY_PAIR!r} pair"}
    else:
        weights = ("from ssd.models.gguf_store import ensure_cached; from ssd.models.loading import PAIRS; "
                   f"[ensure_cached(s) for s in (PAIRS[{PAIR!r}].draft, PAIRS[{PAIR!r}].target)]")
        record["weights"] = step([python, "-c", weights], clock.left())
    record["bench_pair"] = TINY_PAIR if missing else PAIR
    say(f"weights of {PAIR}: {_outcome(record['weights'])}")

    methods, benches = bench_methods(device, gpus), {}
    for precision in ("float32", accelerator_precision(device) or "bfloat16"):
        first = benches.get("float32", {})
        needed = first.get("seconds", 0.0)  # the reduced precision's bench takes about as long as float32's
        if benches and (not first.get("result") or needed > clock.left()):
            why = ("the float32 bench failed" if not first.get("result") else
                   f"it would not fit: float32's took {needed:.0f} s and {clock.left():.0f} s are left")
            benches[precision] = {"skipped": why}
        else:
            benches[precision] = bench_step(step, python, device, precision, methods, clock.left(),
                                            record["bench_pair"])
        say(f"bench in {precision} ({','.join(methods)}): {_outcome(benches[precision])}")
    record["benches"] = benches
    reduced = accelerator_precision(device) or "bfloat16"
    if clock.left() < SHAPES_MIN_S:
        why = f"it would not fit: {clock.left():.0f} s left, it needs about {SHAPES_MIN_S:.0f}"
        record["shapes"] = {"skipped": why}
    else:
        record["shapes"] = shapes_step(step, python, device, reduced, min(SHAPES_S, clock.left()))
    say(f"profiles of {PAIR}'s shapes in {reduced}, b = {', '.join(map(str, SHAPE_BATCHES))}: "
        f"{_outcome(record['shapes'])}{_shapes_line(record['shapes'].get('result'))}")
    record.update(verdicts(benches))
    record["elapsed_s"] = round(clock.elapsed(), 1)
    record["passed"] = passed(record)
    out = out.format(machine=kind_slug(kind_of({"device": device.type, "device_name": record["gpu"]})))
    write_json(out, record)
    say(f"{'passed' if record['passed'] else 'FAILED'}: float32 identical to AR {record['greedy_identical_float32']}, "
        f"reduced-precision differences at near-ties {record['near_ties_reduced']}, sd over hf-sd "
        f"{_ratios(record['sd_over_hf_sd'])}; {record['elapsed_s']:.0f} s; wrote {out}")
    return 0 if record["passed"] else 1


def _outcome(step: dict) -> str:
    """'ok in 41 s: 6 passed in 12.3s', 'failed (exit 1) in 3 s: <its last line>', 'skipped (why)'."""
    if step.get("skipped"):
        return f"skipped ({step['skipped']})"
    if step.get("timed_out"):
        return f"timed out after {step['seconds']:.0f} s"
    state = "ok" if step["returncode"] == 0 else f"failed (exit {step['returncode']})"
    last = next((line.strip() for line in reversed(step.get("output_tail", [])) if line.strip()), "")
    shown = step["returncode"] != 0 or " passed" in last or " skipped" in last  # a failure's cause; pytest's counts
    return f"{state} in {step['seconds']:.0f} s" + (f": {last}" if last and shown else "")


def _shapes_line(result: dict | None) -> str:
    """'; v at K = 4: 1.02 (b 1), ..., c: 0.61 (b 1), ...' from the profiles' summary."""
    if not result:
        return ""
    rows = result["rows"]
    return (f"; v at K = {result['k']}: " + ", ".join(f"{r['v']:.2f} (b {r['batch_size']})" for r in rows)
            + "; c: " + ", ".join(f"{r['c']:.2f} (b {r['batch_size']})" for r in rows))


def _ratios(ratios: dict) -> str:
    return ", ".join(f"{p} {r:.2f}" for p, r in ratios.items() if r is not None) or "n/a"
