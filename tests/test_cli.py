"""The command line: bad input fails fast with one line naming the parameter, before any model loads."""
import json

import pandas as pd
import pytest

from ssd.cli import main
from ssd.bench.prompts import load_prompts, prompt_set


@pytest.mark.parametrize(
    "argv,message",
    [
        (["generate", "--prompt", "x", "-k", "0"], "k (the draft length K) must be an integer >= 1"),
        (["generate", "--prompt", "x", "--temperature", "-1"], "temperature must be a number >= 0"),
        (["generate", "--prompt", "x", "--method", "beam"], "method must be one of"),
        (["generate", "--prompt", "x", "--budget", "-2"], "budget (B, the number of cached outcomes)"),
        (["generate", "--prompt", "x", "--saguaro-c", "2"], "saguaro_c (C) must lie in [0, 1]"),
        (["generate", "--prompt", "x", "--fan-out", "zipf"], "fan_out_strategy must be one of"),
        (["generate", "--prompt", "x", "--backup", "slow"], "backup must be one of jit, fast"),
        (["bench", "--methods", "ar,beam"], "method must be one of"),
        (["bench", "--prompts", "mbpp:3"], "prompts must be one of humaneval, prose"),
        (["bench", "--threads", "0"], "threads must be an integer >= 1"),
        (["bench", "--target-dtype", "int8"], "target_dtype=int8 is a draft's precision only"),
        (["generate", "--prompt", "x", "--pair", "nope"], "pair 'nope' is not known"),
        (["hit-rates", "--saguaro-c", "0.5"], "exact only with --backup jit and --saguaro-c 1"),
        (["hit-rates", "--budgets", "0,x"], "budgets must be comma-separated integers >= 0"),
        (["hit-rates", "--strategies", "uniform,zipf"], "fan_out_strategy must be one of"),
        (["hit-rates", "-k", "auto"], "hit-rates reads every budget off one run at a fixed K"),
        (["course", "--out", "notebooks/", "--report", "runs/report.md"], "report needs a user's run: --out"),
    ],
)
def test_bad_arguments_fail_fast_with_a_clear_message(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


@pytest.mark.parametrize(
    "variant,message",
    [
        ("ar:batch_size=0", "batch_size must be an integer >= 1, got 0"),
        ("sd:k=0", "k (the draft length K) must be an integer >= 1 or 'auto', got 0"),
        ("ssd:budget=-1", "budget (B, the number of cached outcomes) must be an integer >= 0, got -1"),
        ("ssd:backup=slow", "backup must be one of jit, fast, auto; got 'slow'"),
    ],
)
def test_a_variants_bad_value_fails_before_any_model_loads(variant, message, monkeypatch, capsys):
    """A variant's value is checked as the config checks it, as the command line reads it: one line naming the
    variant, the parameter and what it allows, and no model loaded (the bench would otherwise load the pair first)."""
    import ssd.commands
    import ssd.models.loading

    def loads(*args, **kwargs):
        pytest.fail(f"a model loaded for {variant!r}, whose value the command line should have refused")

    monkeypatch.setattr(ssd.models.loading, "load_pair", loads)
    monkeypatch.setattr(ssd.commands, "load_pair", loads)  # ssd.commands holds its own name for it
    assert main(["bench", "--pair", "tiny", "--methods", f"ar,{variant}"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: method variant {variant!r}: {message}"]


def test_prompt_specs(tmp_path):
    assert [p.id for p in load_prompts("humaneval[3:5]")] == ["HumanEval/3", "HumanEval/4"]
    assert len(load_prompts("humaneval:7")) == 7 and len(load_prompts("prose")) == 16
    path = tmp_path / "spec.jsonl"
    rows = [{"question_id": 81, "category": "writing", "turns": ["Write a haiku.", "Again."]},
            {"question_id": 82, "category": "math", "turns": ["What is 2 + 2?"]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    prompts = load_prompts(f"{path}:1")
    assert [(p.id, p.text, p.chat) for p in prompts] == [("81", "Write a haiku.", True)]
    path.write_text('{"turns": []}\n')
    with pytest.raises(ValueError, match="not a Spec-Bench row"):
        load_prompts(str(path))
    with pytest.raises(ValueError, match="selects no prompt"):
        load_prompts("humaneval[500:]")
    # The set a result row belongs to, read off its prompt id (notebook 06 groups the findings by it).
    assert [prompt_set(p.id) for p in load_prompts("humaneval[0:1]") + load_prompts("prose[0:1]")] == [
        "HumanEval", "prose"]
    assert prompt_set("81") == "81"


def test_a_bench_json_reads_back_as_its_rows(tmp_path):
    from ssd.bench.records import load_rows

    path = str(tmp_path / "bench.json")
    argv = ["bench", "--pair", "tiny", "--methods", "ar,sd", "--prompts", "prose[0:2]", "--max-new-tokens", "4",
            "--temperature", "0", "--json", path]
    assert main(argv) == 0
    rows = load_rows(path)
    assert sorted(zip(rows.prompt_id, rows.method)) == [("prose/0", "ar"), ("prose/0", "sd"), ("prose/1", "ar"),
                                                        ("prose/1", "sd")]
    assert rows.identical_to_target.all() and (rows.new_tokens == 4).all()
    (tmp_path / "other.json").write_text('{"summary": []}')
    with pytest.raises(ValueError, match="is not a bench result"):
        load_rows(str(tmp_path / "other.json"))


def test_a_killed_bench_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    from ssd.bench import run as bench
    from ssd.core.decoding import DecodeConfig
    from ssd.models.tiny import tiny_pair

    pair, prompts = tiny_pair(), load_prompts("prose[0:3]")
    config, checkpoint = DecodeConfig(k=2, max_new_tokens=10), str(tmp_path / "b.json.partial")
    whole = bench.run_bench(pair, prompts, ["ar", "sd"], config, progress=False)
    real_run_batch, answers = bench.run_batch, []

    def dies_on_the_last_prompt(method, pair, contexts, config, seed, autotune=None):  # b = 1: one answer a call
        if config.max_new_tokens == 10:  # not the warm-up's (8 tokens)
            answers.append(method)
            if len(answers) == 5:
                raise RuntimeError("killed")  # as a kill would, mid-prompt
        return real_run_batch(method, pair, contexts, config, seed, autotune)

    monkeypatch.setattr(bench, "run_batch", dies_on_the_last_prompt)
    with pytest.raises(RuntimeError, match="killed"):
        bench.run_bench(pair, prompts, ["ar", "sd"], config, progress=False, checkpoint=checkpoint)
    answers.clear()
    resumed = bench.run_bench(pair, prompts, ["ar", "sd"], config, progress=False, checkpoint=checkpoint)
    assert len(answers) == 2  # only the third prompt's two answers ran again
    keys = ["prompt_id", "method", "new_tokens", "identical_to_target"]
    assert [{k: r[k] for k in keys} for r in resumed["rows"]] == [{k: r[k] for k in keys} for r in whole["rows"]]
    assert [s["method"] for s in resumed["summary"]] == ["ar", "sd"]
    with pytest.raises(ValueError, match="holds a bench of other arguments \\(methods differ\\)"):
        bench.run_bench(pair, prompts, ["ar"], config, progress=False, checkpoint=checkpoint)


def test_the_bench_command_writes_csv_and_json_and_leaves_no_checkpoint(tmp_path):
    json_path, csv_path = tmp_path / "b.json", tmp_path / "b.csv"
    argv = ["bench", "--pair", "tiny", "--methods", "ar,sd", "--prompts", "prose[0:1]", "--max-new-tokens", "3",
            "--json", str(json_path), "--csv", str(csv_path)]
    assert main(argv) == 0
    assert json_path.exists() and not (tmp_path / "b.json.partial").exists()
    assert list(pd.read_csv(csv_path).method) == ["ar", "sd"]


@pytest.mark.integration
def test_help_and_argument_errors_answer_before_torch_loads():
    """`python -m ssd --help` and every argument error, of form or of value, import neither torch nor transformers:
    they answer at once (the kit loads in ssd.commands, when a command runs), a value error in the kit's own words."""
    import subprocess
    import sys

    probe = ("import sys, contextlib, io\n"
             "from ssd import cli\n"
             "for argv in (['--help'], ['bench', '--k', 'x'], ['bench', '--max-new-tokens', '0'],\n"
             "             ['bench', '--methods', 'ar,sd:k=two'], ['generate', '--prompt', 'x', '--backup', 'slow'],\n"
             "             ['profile', '--target-dtype', 'int3'], ['bench', '--forward', 'jit'],\n"
             "             ['sweep', 'grid.yaml', '--jobs', '0'],\n"
             "             ['report', '--help'], ['report', '--from', 'no/such/folder']):\n"
             "    err = io.StringIO()\n"
             "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()), "
             "contextlib.redirect_stderr(err):\n"
             "        cli.main(argv)\n"
             "    print(err.getvalue().strip().splitlines()[-1] if err.getvalue() else '')\n"
             "print(sorted(m for m in ('torch', 'transformers', 'pandas') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()  # --help writes nothing to stderr: its line is empty
    assert lines[-1] == "[]", out
    assert lines[2:-1] == ["error: max_new_tokens must be an integer >= 1, got 0",
                           "error: method variant 'sd:k=two': 'two' is neither an integer nor 'auto'",
                           "error: backup must be one of jit, fast, auto; got 'slow'",
                           "error: target_dtype must be one of float32, bfloat16, float16, int8, int4, int8w, auto; "
                           "got "
                           "'int3'", "error: forward must be one of eager, compiled; got 'jit'",
                           "error: jobs must be an integer >= 1, got 0", "",
                           "error: --from must be a folder of one machine's bench JSONs, got 'no/such/folder' (no such "
                           "folder)"], out


def test_the_names_the_parser_offers_are_the_kits_own():
    from ssd import names
    from ssd.bench.methods import METHODS
    from ssd.models.loading import PAIRS

    assert tuple(METHODS) == names.METHOD_NAMES and tuple(PAIRS) == names.PAIR_NAMES


def test_the_backup_is_auto_on_the_command_line_but_for_hit_rates():
    from ssd.cli import build_parser

    parse = build_parser().parse_args
    assert parse(["generate", "--prompt", "x"]).backup == "auto" and parse(["bench"]).backup == "auto"
    assert parse(["hit-rates"]).backup == "jit"  # its replay of smaller budgets is exact for jit alone
