"""llama.cpp as a peer (ssd.llamacpp, ssd.bench.profile_llamacpp, ssd.analysis.engines): reading its tool's output,
its answers checked against its own AR, its profile priced as the kit's, and the bad inputs that fail before
anything loads. The unit tests need no build; the real ones run where llama.cpp is built (`python -m ssd llamacpp`,
about 4 minutes on 2 cores) and skip, saying so, where it is not: `make test` never builds it."""
import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch

from ssd.analysis import engines
from ssd.bench import profile as kit_profile
from ssd.bench import summaries
from ssd.bench.lossless import text_identity
from ssd.bench.run import _reported
from ssd.cli import main
from ssd.core.latencies import Profile
from ssd.core.trace import Trace
from ssd.llamacpp import build, rounding
from ssd.llamacpp.peers import parse_speculative
from ssd.models.tiny import ToyTokenizer

PROMPT = "<|im_start|>user\nadd two numbers<|im_end|>\n<|im_start|>assistant\n"
# The tool's stdout and the lines of its stderr the kit reads, as llama-cpp-python 0.3.36's llama.cpp prints them
STDOUT = "\n\n" + PROMPT + "def add(a, b):\n    return a + b" + "\n\n" + "\n\n"
STDERR = """0.05.220.125 I encoded   16 tokens in    0.383 seconds, speed:   41.791 t/s
0.05.220.134 I decoded   52 tokens in    2.882 seconds, speed:   18.041 t/s
0.05.220.134 I n_draft   = 4
0.05.220.134 I n_predict = 52
0.05.220.134 I n_drafted = 46
0.05.220.135 I n_accept  = 40
0.05.220.135 I accept    = 86.957%
"""


def test_the_tools_answer_times_and_totals_are_read():
    run = parse_speculative(STDOUT, STDERR, PROMPT)
    assert run["text"] == "def add(a, b):\n    return a + b"
    assert (run["prompt_s"], run["decode_s"], run["new_tokens"]) == (0.383, 2.882, 52)
    assert (run["drafted"], run["accepted"]) == (46, 40)
    assert run["rounds"] == 12  # each round ends with one token of the target's own: 52 tokens, 40 of them accepted


@pytest.mark.parametrize("stdout, stderr, message", [
    (STDOUT, STDERR.replace("n_accept ", "n_acc"), "printed no accepted line"),
    ("\n\nanother prompt" + STDOUT[2 + len(PROMPT):], STDERR, "echoed another prompt"),
    (STDOUT[:-2], STDERR, "does not end as this version's does"),
])
def test_an_output_of_another_shape_fails_loudly(stdout, stderr, message):
    with pytest.raises(RuntimeError, match=message):
        parse_speculative(stdout, stderr, PROMPT)


def test_an_engine_that_reports_totals_fills_the_rows_round_columns():
    trace = Trace("llamacpp-sd", prompt_len=10, wall_s=2.0, prefill_s=0.5)
    trace.reported = {"drafted": 46, "accepted": 40, "rounds": 12, "new_tokens": 52}
    row = _reported(trace)
    assert row["acceptance_rate"] == pytest.approx(40 / 46) and row["tokens_per_round"] == pytest.approx(52 / 12)
    assert row["mean_k"] == pytest.approx(46 / 12) and row["mean_accepted"] == pytest.approx(40 / 12)
    assert _reported(Trace("ar", prompt_len=10)) == {}


@dataclasses.dataclass
class Step:
    margin: float


def test_answers_given_as_text_are_identical_whichever_end_token_closed_them():
    tokenizer, eos = ToyTokenizer(10), (8, 9)
    reference = [1, 2, 3, 9]
    rounds = [Step(5.0), Step(4.0), Step(0.5), Step(3.0)]
    assert text_identity([1, 2, 3, 8], reference, rounds, tokenizer, eos)["identical_to_target"]
    moved = text_identity([1, 2, 4, 8], reference, rounds, tokenizer, eos)
    assert moved == {"identical_to_target": False, "first_difference": 2, "margin_at_difference": 0.5,
                     "near_tie": None}
    unfinished = text_identity([1, 2, 3], reference, rounds, tokenizer, eos)
    assert not unfinished["identical_to_target"]  # the same text, but only one of the two ended


@pytest.mark.parametrize("argv, message", [
    (["--pair", "tiny", "--methods", "ar,llamacpp-ar"], "pair='tiny': llamacpp-ar runs the GGUF files"),
    (["--methods", "llamacpp-sd", "--temperature", "0.7"], "temperature=0.7: llamacpp-sd runs greedy only"),
    (["--methods", "ar,llamacpp-ar:batch_size=2"], "batch_size: llamacpp-ar:batch_size=2 takes one prompt a call"),
])
def test_llama_cpp_methods_refuse_what_they_cannot_run_before_anything_loads(argv, message, capsys):
    assert main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_llama_cpp_profile_of_an_unregistered_pair_is_refused(capsys):
    assert main(["profile", "--engine", "llama.cpp", "--pair", "tiny"]) == 2
    assert "pair='tiny': profile --engine llama.cpp runs the GGUF files of a registered offline pair" in \
        capsys.readouterr().err


def test_the_drift_of_a_pair_not_shipped_as_gguf_is_refused_before_anything_loads(capsys):
    assert main(["llamacpp", "--drift", "humaneval:2", "--pair", "tiny"]) == 2
    assert "pair='tiny': llamacpp --drift runs the GGUF files of a registered offline pair" in capsys.readouterr().err


class Positional:
    """A stand-in engine whose logits depend only on the position they predict, plus `bias` on token 1 inside a
    pass over several tokens: as if llama.cpp's pass added in another order than its step."""

    def __init__(self, table, bias):
        self.table, self.bias, self.last = np.asarray(table, dtype=np.float32), bias, []

    def clear(self):
        pass

    def decode(self, tokens, positions, sequences, outputs):
        shift = np.eye(self.table.shape[1], dtype=np.float32)[1] * (self.bias if len(tokens) > 1 else 0.0)
        self.last = [self.table[p + 1 - 4] + shift for p in positions]  # a 4-token prompt: position 3 predicts 0

    def logits(self, i):
        return self.last[i]


def test_the_margin_drift_is_the_pass_against_the_step_at_every_position():
    # answer positions 0..2; tokens 0 and 1 lead at 0 and 2, tokens 2 and 3 at 1 (where token 1 is not in the top
    # two). Position 0 comes from a pass over several tokens both ways (AR's first token is the prompt's pass's).
    table = [[5.0, 4.0, 0.0, 0.0], [0.0, 0.0, 3.0, 2.5], [1.0, 0.9, 0.0, 0.0]]
    drift = rounding.margin_drift(Positional(table, bias=0.25), [7, 7, 7, 7], [0, 2, 0], k=4)
    assert drift == pytest.approx([0.0, 0.0, 0.25])


def test_no_build_without_cmake_says_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SSD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    assert build.built() is None
    with pytest.raises(build.LlamaCppUnavailable, match=r"^llama.cpp is not built here and cannot be: cmake, a C\+\+ "
                       r"compiler \(g\+\+ or clang\+\+\) not found"):
        build.ensure(progress=False)


def test_a_build_is_found_only_once_complete_and_only_for_this_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("SSD_CACHE_DIR", str(tmp_path))
    folder = build.folder()
    assert folder.name == f"{build.VERSION}-{build.cpu_digest()}"
    folder.mkdir(parents=True)
    assert build.built() is None  # a folder without complete.json is a build cut short
    (folder / "complete.json").write_text(json.dumps({"version": build.VERSION}))
    assert build.built().folder == folder


def toy_profile(engine: str, threads: int, batch_size: int = 1, step: float = 40.0, pass5: float = 160.0,
                draft: float = 20.0) -> Profile:
    target = {1: step, 5: pass5, 9: 2 * pass5}
    rows = {1: draft, 4: 2 * draft, 8: 3 * draft}
    return Profile("qwen2.5-coder", {"target": "Q4_K_M", "draft": "Q4_K_M"}, {"cpu": "toy", "flags": []},
                   list(range(threads)), list(range(threads)), 128, target, rows, {"target": 30.0, "draft": 30.0},
                   {"target": 10**9, "draft": 4 * 10**8}, glue_ms={1: draft, 5: 2 * draft, 9: 3 * draft},
                   batch_size=batch_size, engine=engine)


def test_a_llama_cpp_profile_keeps_its_engine_and_is_never_taken_for_the_kits():
    profile = toy_profile("llama.cpp", 2)
    again = Profile.from_dict(json.loads(json.dumps(profile.to_dict())))
    assert again.engine == "llama.cpp" and again == profile
    assert kit_profile.stored_name(profile).startswith("llama.cpp_qwen2.5-coder_Q4_K_M_Q4_K_M_")
    assert Profile.from_dict({k: v for k, v in profile.to_dict().items() if k != "engine"}).engine == "torch"


def bench_result(sd_rounds: int, llama_rounds: int) -> dict:
    rows = [{"method": "sd", "prompt_id": "p", "new_tokens": 48, "rounds": sd_rounds},
            {"method": "llamacpp-sd", "prompt_id": "p", "new_tokens": 48, "engine_new_tokens": 52,
             "rounds": llama_rounds, "wall_s": 3.4, "prefill_s": 1.0}]  # its tool decoded 52 tokens; 48 kept
    peers = [{"method": "llamacpp-sd", "peer": "llamacpp-ar", "measure": "decode_tokens_per_s", "answers": 16,
              "geometric_mean": 0.6, "ci": [0.55, 0.65]}]
    return {"rows": rows, "peers": peers}


def test_sd_is_predicted_on_llama_cpp_from_its_profile_with_either_runs_tokens_per_round():
    # c = 20 / 40 = 0.5 and v = 160 / 40 = 4: E / (4 c + v) = E / 6; llama.cpp's round also runs the draft over the
    # 5 tokens verified, g = glue(5) / step = 40 / 40 = 1: E / 7
    check = engines.sd_check(bench_result(sd_rounds=12, llama_rounds=16), toy_profile("llama.cpp", 2), k=4)
    assert list(check["tokens_per_round_from"]) == ["sd", "llamacpp-sd"]
    assert check["E"].tolist() == pytest.approx([48 / 12, 52 / 16])
    assert check["predicted"].tolist() == pytest.approx([4 / 6, 3.25 / 6])
    assert check["predicted_its_round"].tolist() == pytest.approx([4 / 7, 3.25 / 7])
    assert check["error"].tolist() == pytest.approx([(4 / 6) / 0.6 - 1, (3.25 / 6) / 0.6 - 1])
    assert check["error_its_round"].tolist() == pytest.approx([(4 / 7) / 0.6 - 1, (3.25 / 7) / 0.6 - 1])
    # a round as the profile prices it, 7 steps of 40 ms; as the tool took it: 2.4 s x 52 / 48 over 16 rounds
    assert check["round_ms_profile"].tolist() == pytest.approx([280, 280])
    assert check["round_ms_tool"].iloc[0] == pytest.approx(2400 * 52 / 48 / 16)
    assert check["round_ms_replayed"].isna().all()  # this toy profile replayed no round
    with pytest.raises(ValueError, match="no llamacpp-sd / llamacpp-ar ratio"):
        engines.sd_check(bench_result(12, 16) | {"peers": []}, toy_profile("llama.cpp", 2), k=4)


def test_the_regime_table_puts_each_engine_and_core_set_on_a_row_of_its_own():
    profiles = [toy_profile("llama.cpp", 1), toy_profile("llama.cpp", 2, pass5=120.0), toy_profile("torch", 1),
                toy_profile("llama.cpp", 1, batch_size=4)]
    table = engines.regimes(profiles, k=4, a=0.8)
    assert list(zip(table["engine"], table["threads"])) == [("torch", "target cores [0], draft [0]"),
                                                            ("llama.cpp", "1 thread"), ("llama.cpp", "2 threads")]
    assert table["v"].tolist() == pytest.approx([4.0, 4.0, 3.0]) and table["c"].tolist() == pytest.approx([0.5] * 3)
    assert table["forward"].tolist() == ["eager", "-", "-"]  # the kit's forward; llama.cpp runs its own


def test_a_compiled_profile_is_named_so_beside_its_eager_one():
    eager = toy_profile("torch", 1)
    compiled = dataclasses.replace(eager, forward="compiled")
    assert engines.profile_label(compiled) == engines.profile_label(eager).replace(", target", ", compiled, target")
    assert "compiled" not in engines.profile_label(dataclasses.replace(toy_profile("llama.cpp", 1), forward="compiled"))
    assert engines.regimes([eager, compiled], k=4, a=0.8)["forward"].tolist() == ["eager", "compiled"]


def test_the_fastest_forwards_benches_are_read_apart_from_their_batch_sizes(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    for name, methods in {"fastest_humaneval": "ar,sd,llamacpp-ar", "fastest-batches_humaneval": "ar,sd:batch_size=2",
                          "llamacpp_humaneval": "ar,sd"}.items():
        (folder / f"{name}.json").write_text(json.dumps({"args": {"methods": methods}}))
    assert {k: v["args"]["methods"] for k, v in engines.load_fastest(str(tmp_path), "m").items()} == {
        "humaneval": "ar,sd,llamacpp-ar"}
    assert {k: v["args"]["methods"] for k, v in engines.load_fastest_batches(str(tmp_path), "m").items()} == {
        "humaneval": "ar,sd:batch_size=2"}
    assert engines.load_fastest_batches(str(tmp_path), "none") == {}


def test_a_bench_gives_any_two_of_its_methods_as_a_ratio_answer_by_answer():
    rows = pd.DataFrame([{"method": m, "prompt_id": f"p{i}", "decode_tokens_per_s": v, "tokens_per_s": v}
                         for m, values in {"sd": [2.0, 3.0, 4.0], "llamacpp-ar": [4.0, 4.0, 4.0]}.items()
                         for i, v in enumerate(values)])
    ratio = summaries.paired_ratio(rows, "sd", "llamacpp-ar")
    assert ratio["n"] == 3 and ratio["mean"] == pytest.approx((0.5 * 0.75 * 1.0) ** (1 / 3))
    assert ratio["ci_low"] < ratio["mean"] < ratio["ci_high"]
    assert summaries.paired_ratio(rows, "sd", "ar") is None  # no AR ran: nothing pairs


def test_the_study_is_priced_on_llama_cpps_profiles_at_every_b_timed():
    study = pd.DataFrame([
        {"prompts": "humaneval:16", "batch_size": 1, "label": "sd", "run_mean_accepted": 2.0, "run_p_hit": None,
         "run_all_hit": None, "run_e_hit": None, "run_e_miss": None},
        {"prompts": "humaneval:16", "batch_size": 1, "label": "ssd-pipeline:jit", "run_mean_accepted": 2.0,
         "run_p_hit": 1.0, "run_all_hit": 1.0, "run_e_hit": 3.0, "run_e_miss": 3.0},
        {"prompts": "humaneval:16", "batch_size": 2, "label": "sd", "run_mean_accepted": 2.0, "run_p_hit": None,
         "run_all_hit": None, "run_e_hit": None, "run_e_miss": None}])
    ranks, whole = {1: toy_profile("llama.cpp", 1)}, {1: toy_profile("llama.cpp", 2)}
    out = engines.study_on_engine(study, ranks, whole, k=4, budget=4)
    assert out["batch_size"].tolist() == [1]  # b = 2 has no profile (and no pipeline): left out
    row = out.iloc[0]
    assert row["sd_predicted"] == pytest.approx(3 / 6) and row["sd_predicted_its_round"] == pytest.approx(3 / 7)
    # every round a hit: T_p = (glue(5) + 4 x tree(4)) / verify(5) = (40 + 160) / 160; 3 tokens per max(1, T_p)
    assert row["t_p"] == pytest.approx(200 / 160)
    assert row["pipeline_tokens_per_s"] == pytest.approx(3 / (200 / 160) / 160 * 1000)
    assert row["pipeline_predicted"] == pytest.approx(row["pipeline_tokens_per_s"] / (1000 / 40))


LLAMA = build.built()
needs_llama = pytest.mark.skipif(LLAMA is None, reason="llama.cpp is not built here (python -m ssd llamacpp builds "
                                 "it, about 4 minutes on 2 cores); make test never builds it")


@pytest.mark.real
@needs_llama
def test_llama_cpps_speculative_decoding_gives_its_ar_answer(cores_of_this_worker):
    from ssd.bench.methods import get_method
    from ssd.bench.prompts import encode, load_prompts
    from ssd.core.decoding import DecodeConfig
    from ssd.models.loading import load_pair

    pair = load_pair("qwen2.5-coder", target_dtype="float32", draft_dtype="float32", progress=False)
    config = DecodeConfig(k=4, max_new_tokens=24)
    for prompt in load_prompts("humaneval:2"):
        ids = encode(pair.tokenizer, prompt)
        ar, ar_trace = get_method("llamacpp-ar")(pair, ids, config, torch.Generator())
        sd, sd_trace = get_method("llamacpp-sd")(pair, ids, config, torch.Generator())
        assert len(ar) == len(ar_trace.rounds) == 24 and len(sd) == 24
        report = text_identity(sd, ar, ar_trace.rounds, pair.tokenizer, pair.eos_token_ids)
        assert report["identical_to_target"], report
        assert sd_trace.reported["drafted"] > 0 and 0 < ar_trace.prefill_s < ar_trace.wall_s
