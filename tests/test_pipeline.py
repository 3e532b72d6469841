"""The two-rank SSD pipeline on tiny random pairs: the same tokens as one-process SSD, and faults that end both ranks.

Each Pipeline spawns a drafter process (a few seconds: a fresh interpreter imports torch and transformers), so the
correctness tests share the one that the module's pair keeps (pair.pipeline), and each fault test starts its own.
"""
import _thread
import functools
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pandas as pd
import pytest
import torch

import ssd.bench.methods
from ssd.bench.frames import rounds_frame, spans_frame
from ssd.bench.run import run_one
from ssd.bench.summaries import measured_theorem7, summarize
from ssd.cli import build_parser, main
from ssd.commands import setup
from ssd.core.decoding import DecodeConfig, generate_ar, generate_sd
from ssd.bench.methods import get_method
from ssd.models.loading import load_pair
from ssd.models.pair import Pair
from ssd.models.tiny import tiny_pair
from ssd.models.cores import parse_cores
from ssd.pipeline.launch import (Pipeline, PipelineConfig, close_pipeline, close_pipelines, generate_ssd_pipeline,
                                 open_pipelines, pipeline_for)
from ssd.pipeline.transport import PipelineError
from ssd.core.speculation import SSDConfig, generate_ssd
from ssd.pipeline.protocol import clock_offset

CORES = [str(c) for c in sorted(os.sched_getaffinity(0))]
VERIFIER, DRAFTER = CORES[0], CORES[-1]  # two cores where there are two; one shared core otherwise
PAIR_ARGS = dict(vocab_size=32, agreement_noise=0.1, seed=4)
PROMPTS = [[1, 2, 3], [7, 7, 1, 7, 7, 1, 7]]
RECORD = ["draft_len", "accepted", "token", "new_tokens", "hit", "rank", "fan_out", "a_p", "r", "backup"]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(**PAIR_ARGS)


def config(**options) -> PipelineConfig:
    return PipelineConfig(verifier_cores=VERIFIER, drafter_cores=DRAFTER, timeout_s=30, **options)


def records(trace) -> list[tuple]:
    """Everything a round decided, without its times."""
    return [tuple(getattr(r, f) for f in RECORD) for r in trace.rounds]


def run(method, pair, prompt, seed, cfg):
    generator = torch.Generator().manual_seed(seed)
    tokens, trace = method(pair, prompt, cfg, generator)
    return tokens, trace, generator.get_state()


# ---- the same tokens as one process ------------------------------------------------------------------------------

GREEDY = [
    dict(fan_out_strategy="uniform", budget=0, saguaro_c=1.0, backup="jit"),
    dict(fan_out_strategy="uniform", budget=4, saguaro_c=0.5, backup="fast"),
    dict(fan_out_strategy="geometric", budget=16, saguaro_c=1.0, backup="jit"),
    dict(fan_out_strategy="geometric", budget=4, saguaro_c=0.5, backup="fast"),
    dict(fan_out_strategy="calibrated", budget=16, saguaro_c=0.5, backup="jit"),
    dict(fan_out_strategy="calibrated", budget=16, saguaro_c=1.0, backup="fast"),
]


@pytest.mark.integration
@pytest.mark.parametrize("options", GREEDY, ids=lambda o: "-".join(str(v) for v in o.values()))
def test_greedy_pipeline_is_token_identical_to_the_target(pair, options):
    cfg = config(k=4, max_new_tokens=30, **options)
    for prompt in PROMPTS:
        reference, _ = generate_ar(pair, prompt, cfg, torch.Generator())
        tokens, trace, _ = run(generate_ssd_pipeline, pair, prompt, 0, cfg)
        assert tokens == reference
        # Round by round the same decisions as one-process SSD: the protocol hides nothing and adds nothing.
        assert records(trace) == records(run(generate_ssd, pair, prompt, 0, cfg)[1])
        if options["budget"] == 0:
            assert trace.hit_rate == 0


@pytest.mark.integration
@pytest.mark.parametrize(
    "options",
    [
        dict(fan_out_strategy="uniform", budget=8, saguaro_c=1.0, backup="jit"),
        dict(fan_out_strategy="geometric", budget=16, saguaro_c=0.5, backup="fast"),
        dict(fan_out_strategy="calibrated", budget=4, saguaro_c=0.2, backup="jit"),
    ],
    ids=["uniform-jit", "geometric-saguaro-fast", "calibrated-saguaro-jit"],
)
def test_sampled_pipeline_yields_generate_ssd_tokens_for_the_same_seed(pair, options):
    cfg = config(k=4, temperature=0.8, max_new_tokens=40, **options)
    hits = []
    for seed, prompt in itertools.product(range(3), PROMPTS):
        tokens, trace, state = run(generate_ssd_pipeline, pair, prompt, seed, cfg)
        expected, expected_trace, expected_state = run(generate_ssd, pair, prompt, seed, cfg)
        assert tokens == expected
        assert records(trace) == records(expected_trace)
        assert torch.equal(state, expected_state)  # the caller's generator ends where generate_ssd leaves it
        hits += [r.hit for r in trace.rounds]
    assert 0 < sum(hits) < len(hits)  # hits and misses (backups) both exercised


@pytest.mark.integration
def test_max_new_tokens_one_and_a_short_last_round(pair):
    for n in (1, 2, 6):
        cfg = config(k=4, temperature=0.8, max_new_tokens=n, budget=4)
        tokens, trace, _ = run(generate_ssd_pipeline, pair, [5, 6], 1, cfg)
        expected, expected_trace, _ = run(generate_ssd, pair, [5, 6], 1, cfg)
        assert (tokens, records(trace)) == (expected, records(expected_trace))
        assert len(tokens) == n


@pytest.mark.integration
def test_trace_holds_both_ranks_times_and_feeds_theorem_7(pair):
    _, trace, _ = run(generate_ssd_pipeline, pair, [5, 6, 7], 0, config(k=4, temperature=1.0, max_new_tokens=60,
                                                                        budget=8))
    frame = rounds_frame(trace)
    assert trace.method == "ssd-pipeline" and (frame.method == "ssd-pipeline").all()
    assert (frame.verify_s > 0).all() and (frame.prespec_s > 0).all() and (frame.wait_s > 0).all()
    misses = frame[frame.backup.notna()]
    assert len(misses) and (misses.draft_s > 0).all()
    predicted = measured_theorem7(frame)
    assert 0 < predicted["p_hit"] < 1 and predicted["t_p"] > 0 and predicted["tokens_per_verify"] > 0
    # Both ranks' spans on the verifier's clock, in the order the messages force: round i's lookup (or backup) after
    # the verify pass that gave its outcome; round i + 1's verify pass after that lookup drafted it, and after round
    # i's pre-speculation (which the drafter starts as it sends round i's drafts).
    spans = spans_frame(trace)
    assert spans.start_s.min() >= 0 and spans.end_s.max() <= trace.wall_s and (spans.end_s >= spans.start_s).all()
    by = spans.dropna(subset=["round"]).groupby(["round", "phase"]).agg(start=("start_s", "min"), end=("end_s", "max"))
    for i in range(len(trace.rounds)):
        verify, prespec, draft = (by.loc[(i, phase)] for phase in ("verify_s", "prespec_s", "draft_s"))
        assert draft.start >= verify.end
        if i + 1 < len(trace.rounds):
            following = by.loc[(i + 1, "verify_s")]
            assert following.start >= draft.end and following.start >= prespec.end
    assert np.isclose(spans[spans.phase == "verify_s"].eval("end_s - start_s").sum(), frame.verify_s.sum())
    assert np.isclose(spans[spans.phase == "prespec_s"].eval("end_s - start_s").sum(), frame.prespec_s.sum())
    # Round 0's verify pass fed the target its prompts: no pass apart, and the prompts' pass ends with it. On two
    # cores of one machine the drafter pre-speculated round 0 before that pass, which takes both ranks' cores.
    assert trace.prefill_s == by.loc[(0, "verify_s")].end
    before = spans[spans["round"].isna()]  # only the drafter's prompts' pass and first drafts: one span, first
    assert before[["phase", "lane"]].values.tolist() == [["draft_s", "draft"]]
    assert before.end_s.iloc[0] <= by.loc[(0, "prespec_s")].start
    if VERIFIER != DRAFTER:
        assert by.loc[(0, "prespec_s")].end <= by.loc[(0, "verify_s")].start
        assert by.loc[(1, "prespec_s")].start >= by.loc[(0, "draft_s")].end  # later rounds: while verified


def test_the_clock_offset_of_one_exchange():
    # The drafter's clock runs 100 s ahead; each transit takes 2 s: exact. Transits of 1 s and 3 s: off by 1 s.
    assert clock_offset(sent_s=0.0, received_s=102.0, replied_s=110.0, answered_s=12.0) == 100.0
    assert clock_offset(sent_s=0.0, received_s=101.0, replied_s=110.0, answered_s=13.0) == 99.0


@pytest.mark.integration
def test_the_drafter_loads_its_draft_at_the_pairs_precision():
    """A pair whose draft is int8: the spawned drafter loads its own draft at int8 too, so the pipeline makes the same
    decisions as one-process SSD on that pair, and the target's tokens."""
    close_pipelines()
    pair = load_pair("tiny", draft_dtype="int8")
    cfg = SSDConfig(k=3, max_new_tokens=20, budget=4)
    prompt = [1, 2, 3, 1, 2]
    with Pipeline(pair, verifier_cores=VERIFIER, drafter_cores=DRAFTER, timeout_s=30) as pipeline:
        assert pipeline.drafter.precision == "int8"
        tokens, trace = pipeline.generate(prompt, cfg, torch.Generator().manual_seed(0))
    assert tokens == generate_ar(pair, prompt, cfg, torch.Generator())[0]
    assert records(trace) == records(generate_ssd(pair, prompt, cfg, torch.Generator().manual_seed(0))[1])
    assert 0 < trace.prefill_s < trace.wall_s  # the prompt's pass: round 0's verify pass fed it


@pytest.mark.integration
def test_the_method_keeps_one_drafter_across_calls_and_close_stops_it(pair):
    cfg = config(k=3, max_new_tokens=8, budget=4)
    pipeline = pipeline_for(pair, cfg)
    get_method("ssd-pipeline")(pair, [1, 2], cfg, torch.Generator())
    assert pipeline_for(pair, cfg) is pipeline and pipeline.process.is_alive()
    assert pipeline.drafter.cores == [int(DRAFTER)] and pipeline.drafter.threads == 1
    close_pipelines()
    assert pipeline.closed and pipeline.process.exitcode == 0  # asked to stop, it stopped by itself
    assert pair.pipeline is None and not open_pipelines()


@pytest.mark.integration
def test_two_pairs_never_share_a_drafter():
    """Each pair keeps its own Pipeline: the second pair's call closes the first's (one process group per process)
    and starts its own drafter, even once the caller has dropped the first pair: nothing is looked up by id()."""
    close_pipelines()
    cfg = config(k=3, max_new_tokens=8, budget=4)
    first = tiny_pair(**PAIR_ARGS)
    generate_ssd_pipeline(first, [1, 2], cfg, torch.Generator())
    kept = first.pipeline
    del first  # its Pipeline stays open (it owns the drafter and the process group) until another makes it close
    second = tiny_pair(**PAIR_ARGS)
    tokens, _ = generate_ssd_pipeline(second, [1, 2, 3], cfg, torch.Generator())
    assert second.pipeline is not kept and second.pipeline.pair is second
    assert kept.closed and kept.process.exitcode == 0 and kept.pair.pipeline is None
    assert second.pipeline.process.pid != kept.process.pid and open_pipelines() == [second.pipeline]
    assert tokens == generate_ar(second, [1, 2, 3], cfg, torch.Generator())[0]
    close_pipelines()


@pytest.mark.integration
def test_close_pipeline_closes_that_pairs_pipeline(pair):
    cfg = config(k=3, max_new_tokens=8, budget=4)
    generate_ssd_pipeline(pair, [1, 2], cfg, torch.Generator())
    kept = pair.pipeline
    close_pipeline(pair)
    assert kept.closed and kept.process.exitcode == 0 and pair.pipeline is None and not open_pipelines()
    close_pipeline(pair)  # none kept: nothing to do
    generate_ssd_pipeline(pair, [1, 2], cfg, torch.Generator())  # the next call opens another
    assert pair.pipeline not in (None, kept) and open_pipelines() == [pair.pipeline]
    close_pipeline(pair)


@pytest.mark.integration
def test_the_ranks_first_work_may_take_both_ranks_cores(pair, monkeypatch):
    """Each rank waits idle for the other's first work: a local drafter on a core of its own is offered both ranks'
    cores (the Start message) for its prompt pass, first drafts and round 0's pre-speculation, which the verifier's
    round 0 then takes in turn, and the tokens stay the same."""
    cfg = config(k=3, max_new_tokens=8, budget=4)
    pipeline = pipeline_for(pair, cfg)
    sent, send = [], pipeline.channel.send

    def recording(message, *args, **kwargs):
        sent.append(message)
        return send(message, *args, **kwargs)

    monkeypatch.setattr(pipeline.channel, "send", recording)
    tokens, trace = pipeline.generate([1, 2, 3], cfg, torch.Generator().manual_seed(0))
    start = next(m for m in sent if type(m).__name__ == "Start")
    both = tuple(sorted({int(VERIFIER), int(DRAFTER)}))
    assert start.first_cores == (both if len(both) > 1 else ())
    assert tokens == generate_ar(pair, [1, 2, 3], cfg, torch.Generator())[0]


@pytest.mark.integration
def test_bench_summary_of_the_pipeline_has_hit_rate_and_theorem_7(pair):
    cfg = config(k=4, temperature=1.0, max_new_tokens=30, budget=8)
    rows, frames = [], []
    for method in ("ar", "ssd-pipeline"):
        _, row, trace = run_one(method, pair, [3, 4, 5], cfg, seed=0)
        rows.append({**row, "identical_to_target": None})
        frames.append(rounds_frame(trace))
    summary = {s["method"]: s for s in summarize(pd.DataFrame(rows), pd.concat(frames))}["ssd-pipeline"]
    assert 0 < summary["hit_rate"] < 1 and summary["t_p"] > 0 and summary["speedup_vs_ar"] > 0
    assert summary["predicted_speedup_vs_ar"] > 0


def test_sd_1core_is_sd_on_one_thread_and_restores_the_thread_count(pair, monkeypatch):
    seen = []

    def spy(*args, **options):
        seen.append(torch.get_num_threads())
        return generate_sd(*args, **options)

    monkeypatch.setattr(ssd.bench.methods, "generate_sd", spy)
    torch.set_num_threads(2)
    try:
        tokens, trace = get_method("sd-1core")(pair, [1, 2, 3], DecodeConfig(max_new_tokens=20), torch.Generator())
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)
    assert seen == [1] and trace.method == "sd-1core"
    assert tokens == generate_sd(pair, [1, 2, 3], DecodeConfig(max_new_tokens=20), torch.Generator())[0]


def test_cli_passes_the_cores_to_the_pipeline_config():
    args = build_parser().parse_args(["bench", "--pair", "tiny", "--verifier-cores", "0-1", "--drafter-cores", "1"])
    _, cfg = setup(args)
    assert isinstance(cfg, PipelineConfig) and (cfg.verifier_cores, cfg.drafter_cores) == ("0-1", "1")


# ---- bad input ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["", "a", "1-", "-1", "3-1", "0,,1", "0.5"])
def test_bad_cores_are_refused_naming_the_parameter(spec):
    with pytest.raises(ValueError, match="drafter_cores must list CPU cores"):
        PipelineConfig(drafter_cores=spec)
    with pytest.raises(ValueError, match="verifier_cores must list CPU cores"):
        parse_cores(spec, "verifier_cores")


def test_cores_parse():
    assert parse_cores("0", "c") == [0] and parse_cores(" 2-4, 0", "c") == [0, 2, 3, 4]


@pytest.mark.integration
def test_bad_pipeline_arguments_fail_before_a_drafter_starts(pair):
    close_pipelines()
    with pytest.raises(ValueError, match="drafter_cores='999' names cores \\[999\\] that this machine does not offer"):
        Pipeline(pair, verifier_cores=VERIFIER, drafter_cores="999")
    with pytest.raises(ValueError, match="verifier_cores must list CPU cores"):
        Pipeline(pair, verifier_cores="x")
    with pytest.raises(ValueError, match="draft_source 'no-such-pair' is not known"):
        Pipeline(pair, verifier_cores=VERIFIER, drafter_cores=DRAFTER, draft_source="no-such-pair")
    with pytest.raises(ValueError, match="draft_source is needed"):
        Pipeline(Pair(pair.draft, pair.target, None, "anonymous"), verifier_cores=VERIFIER, drafter_cores=DRAFTER)
    with pytest.raises(ValueError, match="timeout_s must be a number of seconds > 0"):
        Pipeline(pair, timeout_s=0)
    with pytest.raises(ValueError, match="config must be an SSDConfig"):
        generate_ssd_pipeline(pair, [1], DecodeConfig(), torch.Generator())
    with pytest.raises(ValueError, match="prompt_ids holds ids outside the vocabulary"):
        generate_ssd_pipeline(pair, [99], config(), torch.Generator())
    assert pair.pipeline is None and not open_pipelines()  # none of it started a drafter


def test_cli_refuses_bad_cores_and_an_unknown_pair(capsys):
    assert main(["generate", "--prompt", "x", "--drafter-cores", "one"]) == 2
    assert "drafter_cores must list CPU cores" in capsys.readouterr().err
    assert main(["generate", "--prompt", "x", "--method", "ssd-pipeline", "--pair", "nope"]) == 2
    assert "pair 'nope' is not known" in capsys.readouterr().err


# ---- faults: each ends both ranks within seconds, with the cause in the message -----------------------------------


def sabotaged_pair(fault: str, after: int = 0) -> Pair:
    """The tiny pair whose draft fails on its after-th forward (0: while loading): raises, exits or hangs."""
    if after == 0:
        act(fault)
    pair = tiny_pair(**PAIR_ARGS)
    forward, calls = pair.draft.forward, itertools.count(1)

    def sabotaged(*args, **kwargs):
        if next(calls) == after:
            act(fault)
        return forward(*args, **kwargs)

    pair.draft.forward = sabotaged
    return pair


def act(fault: str) -> None:
    if fault == "raise":
        raise RuntimeError("the draft failed on purpose")
    if fault == "exit":
        os._exit(3)
    if fault == "hang":
        time.sleep(3600)


def start(fault: str, after: int, **options) -> Pipeline:
    close_pipelines()  # one process group per process: the pipeline a pair keeps makes way
    source = functools.partial(sabotaged_pair, fault, after)
    return Pipeline(tiny_pair(**PAIR_ARGS), verifier_cores=VERIFIER, drafter_cores=DRAFTER, draft_source=source,
                    **options)


def generate(pipeline, **options):
    return pipeline.generate([1, 2, 3], SSDConfig(k=4, max_new_tokens=60, budget=8, temperature=1.0, **options),
                             torch.Generator().manual_seed(0))


def assert_ended(pipeline, started: float, within_s: float):
    assert pipeline.closed and not pipeline.process.is_alive()
    assert time.monotonic() - started < within_s


@pytest.mark.integration
def test_a_drafter_that_raises_while_loading_is_reported_with_its_traceback():
    with pytest.raises(PipelineError, match="(?s)exited with code 1.*RuntimeError: the draft failed on purpose"):
        start("raise", 0)
    assert not open_pipelines()


@pytest.mark.integration
@pytest.mark.parametrize(
    "fault,match",
    [
        ("raise", "(?s)exited with code 1.*in sabotaged.*the draft failed on purpose"),  # its traceback is quoted
        ("exit", "exited with code 3"),
    ],
)
def test_a_drafter_that_fails_mid_generation_is_reported(fault, match):
    pipeline = start(fault, 25)
    started = time.monotonic()
    with pytest.raises(PipelineError, match=match):
        generate(pipeline)
    assert_ended(pipeline, started, 5)


@pytest.mark.integration
def test_a_drafter_that_hangs_mid_generation_times_out_and_is_stopped():
    # 3 s, not 1: the first drafts come after the drafter's prompts' pass, first drafts and round 0's pre-speculation,
    # which on a machine busy with the other tests' worker once took over 1 s (a timeout before the hang).
    pipeline = start("hang", 25, timeout_s=3.0)
    started = time.monotonic()
    # The hang may come while pre-speculating (the verdicts cannot be delivered) or in the backup (no next draft).
    hang = "no reply within timeout_s=3 s while (sending the verdicts|waiting for the draft)"
    with pytest.raises(PipelineError, match=hang):
        generate(pipeline)
    assert_ended(pipeline, started, 8)
    assert pipeline.process.exitcode == -signal.SIGKILL


@pytest.mark.integration
def test_a_drafter_that_hangs_while_loading_times_out():
    close_pipelines()
    started = time.monotonic()
    # Starting the interpreter and loading the draft each get load_timeout_s; on a busy machine either may run out.
    with pytest.raises(PipelineError, match="(did not start|no reply) within load_timeout_s=6 s"):
        start("hang", 0, load_timeout_s=6)
    assert time.monotonic() - started < 15 and not open_pipelines()


@pytest.mark.integration
def test_ctrl_c_in_the_verifier_ends_both_ranks():
    # A process started in the background by a shell inherits SIGINT ignored, and then interrupt_main does nothing;
    # a Jupyter kernel, like an interactive python, turns SIGINT into KeyboardInterrupt. Test that case.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        pipeline = start("hang", 25)
        timer = threading.Timer(1.0, _thread.interrupt_main)  # what a notebook's interrupt button does
        timer.start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            generate(pipeline)
        timer.join()
        assert_ended(pipeline, started, 5)
    finally:
        signal.signal(signal.SIGINT, previous)


def state(pid: int) -> str | None:
    """A process's state letter (Z: exited, not yet reaped), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


@pytest.mark.integration
def test_a_drafter_whose_verifier_is_killed_exits_by_itself():
    close_pipelines()
    script = ("from ssd.models.tiny import tiny_pair\nfrom ssd.pipeline.launch import Pipeline\nimport time\n"
              "if __name__ == '__main__':\n"
              f"    p = Pipeline(tiny_pair(), verifier_cores='{VERIFIER}', drafter_cores='{DRAFTER}')\n"
              "    print(p.process.pid, flush=True)\n    time.sleep(60)\n")
    verifier = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        drafter = int(verifier.stdout.readline())
        verifier.kill()
        verifier.wait()
        started = time.monotonic()
        while state(drafter) not in (None, "Z") and time.monotonic() - started < 10:
            time.sleep(0.1)
        assert state(drafter) in (None, "Z")
    finally:
        verifier.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.integration
def test_torchrun_ranks_serve_the_same_tokens(monkeypatch):
    """Rank 1 as torchrun starts it (`python -m ssd.torchrun ARGS`), rank 0 here; the same env on both."""
    close_pipelines()
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    drafter = subprocess.Popen([sys.executable, "-m", "ssd.torchrun", "generate", "--pair", "tiny", "--prompt", "x",
                                "--drafter-cores", DRAFTER], env=os.environ | env)
    try:
        for key, value in (env | {"RANK": "0"}).items():
            monkeypatch.setenv(key, value)
        pair = load_pair("tiny")
        cfg = SSDConfig(k=3, max_new_tokens=20, budget=4)
        with Pipeline(pair, verifier_cores=VERIFIER, drafter_cores=DRAFTER, load_timeout_s=60) as pipeline:
            assert pipeline.process is None and pipeline.drafter.pid == drafter.pid
            tokens, _ = pipeline.generate([1, 2, 3], cfg, torch.Generator())
        assert tokens == generate_ar(pair, [1, 2, 3], cfg, torch.Generator())[0]
        assert drafter.wait(timeout=20) == 0  # told to stop when rank 0 closed
    finally:
        drafter.kill()
