"""The report (``python -m ssd report``): the committed docs/results.md and README block are what the generator makes
from data/; the rules that pick a figure's file; the arithmetic of its interval; "not measured" where no file holds
a figure."""
import json
import os
import re

import numpy as np
import pytest
from scipy import stats

from ssd.analysis import report, report_files, verdicts
from ssd.analysis.sources import plain, read_folder
from ssd.bench.machines import DATA
from ssd.files import KIT_ROOT

AUTO = {"target": "bfloat16", "draft": "int8", "reason": "auto: target bfloat16 (timed here)"}
EPYC = {"cpu": "AMD EPYC", "isa": "AVX512", "flags": ["avx2", "avx512f", "avx512_vnni", "avx512_bf16"],
        "native": ["bfloat16"], "cores": 2}  # the kind of machine of data/amd-epyc-avx512-bf16
FLOAT32 = {"target": "float32", "draft": "float32", "reason": "as asked: target float32, draft float32"}
INT4 = {"target": "int4", "draft": "int4", "reason": "as asked: target int4, draft int4"}


def bench(folder, name, rates: dict, precision=AUTO, date="2026-12-01T00:00:00+00:00", prompts="HumanEval", **args):
    """A bench JSON as `python -m ssd bench --json` writes it, with only what the report reads: rates maps a method
    to its decode tokens/s per prompt (its whole call's: 0.8 of them)."""
    rows = [{"method": m, "prompt_id": f"{prompts}/{i}", "decode_tokens_per_s": v, "tokens_per_s": 0.8 * v,
             "batch_size": 1,
             "identical_to_target": True if m != "ar" else None}
            for m, values in rates.items() for i, v in enumerate(values)]
    result = {"args": {"pair": "qwen2.5-coder", "k": 4, "temperature": 0.0, "max_new_tokens": 48, "budget": 4,
                       "fan_out": "calibrated", **args},
              "environment": {"date": date, "commit": "abc1234", "capability": EPYC},
              "precision": precision, "rows": rows, "summary": []}
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "w") as f:
        json.dump(result, f)


def figure(pg, key, prompts="humaneval"):
    return next(f for f in pg.figures[pg.precisions[0]] if f.key == key and f.prompts == prompts)


@pytest.fixture(scope="module")
def pages():
    return report_files.stored_pages(DATA)


def test_docs_results_md_is_what_the_report_makes_from_data(pages):
    with open(KIT_ROOT / "docs" / "results.md") as f:
        assert report_files.results_markdown(pages) == f.read(), "run `python -m ssd report` and commit the result"
    for pg in pages:
        assert (KIT_ROOT / "docs" / "results" / f"{pg.machine}.png").exists()


def test_the_readmes_table_is_generated_and_short(pages):
    with open(KIT_ROOT / "README.md") as f:
        readme = f.read()
    block = report_files.readme_block(pages)
    assert block in readme, "run `python -m ssd report` and commit README.md"
    rows = [line for line in block.splitlines() if line.startswith("| ")][1:]  # after the header
    assert 0 < len(rows) <= report_files.MAX_ROWS
    cells = [cell.strip() for row in rows for cell in row.strip("|").split("|")[1:]]
    assert max(map(len, cells)) <= report_files.MAX_CELL
    assert report_files.with_block(readme, block) == readme


def test_a_ratio_is_the_geometric_mean_of_per_answer_decode_ratios_with_a_t_interval_of_their_logs(tmp_path):
    bench(tmp_path / "m", "a.json", {"ar": [1.0, 2.0, 4.0, 5.0], "sd": [2.0, 3.0, 8.0, 5.0]})
    pg = report.page(str(tmp_path / "m"))
    sd = figure(pg, "sd/ar")
    logs = np.log([2.0, 1.5, 2.0, 1.0])
    mean, half = logs.mean(), stats.t.ppf(0.975, 3) * stats.tstd(logs) / 2
    low, high = np.exp(mean - half), np.exp(mean + half)
    assert sd.mean == pytest.approx(np.exp(mean)) and sd.low == pytest.approx(low) and sd.high == pytest.approx(high)
    assert sd.cell == f"{np.exp(mean):.2f}x [{low:.2f}, {high:.2f}]" and sd.source == "a.json"
    assert sd.sample == "4 prompts" and sd.what == "SD over AR, by decode tokens/s"


def test_every_ratio_rows_label_names_its_measure(pages):
    for pg in pages:
        for f in (f for figures in pg.figures.values() for f in figures if f.value.endswith("x")):
            assert re.search(r", by [\w' -]*tokens/s", f.what), f.what


def test_the_file_with_the_most_prompts_wins_then_the_one_made_for_the_comparison(tmp_path):
    folder = tmp_path / "m"
    bench(folder, "few.json", {"ar": [1.0] * 3, "sd": [2.0] * 3}, date="2026-12-09T00:00:00+00:00")
    bench(folder, "many.json", {"ar": [1.0] * 5, "sd": [3.0] * 5})
    assert figure(report.page(str(folder)), "sd/ar").source == "many.json"
    bench(folder, "study.json", {"ar": [1.0] * 5, "sd": [4.0] * 5, "hf-ar": [1.0] * 5},
          date="2026-12-09T00:00:00+00:00")
    assert figure(report.page(str(folder)), "sd/ar").source == "many.json"  # fewer methods, though older
    bench(folder, "later.json", {"ar": [1.0] * 5, "sd": [5.0] * 5}, date="2026-12-09T00:00:00+00:00")
    assert figure(report.page(str(folder)), "sd/ar").source == "later.json"  # the same size and breadth: the newer


def test_a_file_at_another_precision_or_temperature_is_not_read_for_the_machines_figures(tmp_path):
    folder = tmp_path / "m"
    bench(folder, "auto.json", {"ar": [1.0] * 3, "sd": [2.0] * 3})
    bench(folder, "float32.json", {"ar": [1.0] * 8, "sd": [1.1] * 8}, precision=FLOAT32)
    bench(folder, "sampled.json", {"ar": [1.0] * 8, "sd": [1.2] * 8}, temperature=0.7)
    pg = report.page(str(folder))
    assert pg.precisions == [("bfloat16", "int8")] and figure(pg, "sd/ar").source == "auto.json"


def with_graphs(path, made_by_first_prompt: int) -> None:
    """Record graphs_made in a bench's rows, as a compiled bench does: the first prompt's calls made that many."""
    with open(path) as f:
        result = json.load(f)
    for row in result["rows"]:
        row["graphs_made"] = made_by_first_prompt if row["prompt_id"].endswith("/0") else 0
    with open(path, "w") as f:
        json.dump(result, f)


def test_the_fastest_forwards_are_read_only_where_no_timed_call_made_a_graph(tmp_path):
    folder = tmp_path / "m"
    bench(folder, "auto.json", {"ar": [1.0] * 3, "sd": [2.0] * 3})
    ran = {"ar": [1.0] * 4, "sd": [9.0, 1.5, 1.5, 1.5], "llamacpp-ar": [1.0, 2.0, 2.0, 2.0]}
    bench(folder, "compiled.json", ran, precision=INT4, forward="compiled")
    with_graphs(folder / "compiled.json", 2)  # HumanEval/0's calls compiled: it drops out
    bench(folder, "unrecorded.json", {k: v * 2 for k, v in ran.items()}, precision=INT4, forward="compiled")
    bench(folder, "eager.json", {k: v * 2 for k, v in ran.items()}, precision=INT4)
    with_graphs(folder / "eager.json", 0)
    pg = report.page(str(folder))
    fast = {f.key: f for f in pg.compiled}
    # not the file without graphs_made, nor the eager one, though each holds more prompts
    assert fast["compiled:sd/ar"].source == "compiled.json" and fast["compiled:sd/ar"].sample == "3 prompts"
    assert fast["compiled:sd/ar"].value == "1.50x" and fast["compiled:sd/llamacpp-ar"].value == "0.75x"
    page_text = report.markdown(pg)
    assert "At target int4, draft int4, compiled forwards (" in page_text  # its table, named in the settings line
    assert "target bfloat16, draft int8; target int4, draft int4, compiled forwards ·" in page_text
    assert "our SD runs 0.75x llama.cpp's AR" in verdicts.verdict(pg)
    assert figure(pg, "sd/ar").source == "auto.json"  # the rest of the page stays at auto's precision


def test_a_figure_no_file_holds_renders_not_measured(tmp_path):
    bench(tmp_path / "m", "a.json", {"ar": [1.0] * 3, "sd": [2.0] * 3}, prompts="prose")
    pg = report.page(str(tmp_path / "m"))
    assert {f.prompts for f in pg.figures[pg.precisions[0]]} == {"prose"}  # no HumanEval rows: none measured
    missing = figure(pg, "pipeline/sd-1core", "prose")
    assert missing.value == report.NOT_MEASURED and missing.source == "" and missing.mean is None
    assert ("| the pipeline over SD on one core (sd-1core), B 4, calibrated fan-out, by decode tokens/s | prose "
            "| not measured | - | - |"
            in report.markdown(pg))


def test_ours_over_transformers_is_the_geometric_mean(tmp_path):
    bench(tmp_path / "m", "a.json", {"ar": [1.0, 1.0, 1.0], "hf-ar": [0.5, 1.0, 2.0]})
    f = figure(report.page(str(tmp_path / "m")), "ar/hf-ar")
    assert f.mean == pytest.approx(1.0) and f.low < 1.0 < f.high


def test_greedy_identity_counts_per_method(tmp_path):
    bench(tmp_path / "m", "a.json", {"ar": [1.0] * 3, "sd": [2.0] * 3})
    assert figure(report.page(str(tmp_path / "m")), "identity").value == "sd 3/3"


def test_variants_that_set_k_or_b_are_not_the_method():
    assert plain("sd") == "sd" and plain("ar:batch_size=8") == "ar" and plain("sd:k=2") is None
    assert plain("ssd-pipeline:backup=jit:batch_size=2") == "ssd-pipeline:jit"


def test_bad_folders_fail_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="folder must be a folder of one machine's results"):
        read_folder(str(tmp_path / "none"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="folder must hold bench JSONs or sweep CSVs"):
        report.page(str(tmp_path / "empty"))


def test_a_users_page_sits_beside_the_nearest_stored_machine(tmp_path):
    bench(tmp_path / "mine", "a.json", {"ar": [1.0] * 3, "sd": [2.0] * 3})
    out = report_files.beside(str(tmp_path / "mine"), DATA, str(tmp_path / "report.md"))
    text = open(out).read()
    assert "## your results: amd-epyc-avx512-bf16" in text and "Samples: 3 prompts a figure" in text
    assert "## the nearest stored machine: amd-epyc-avx512-bf16" in text and "(the stored page's: 16)" in text
    assert (tmp_path / "report.png").exists()


def test_an_empty_folder_fails_in_one_line_naming_from(tmp_path, capsys):
    from ssd.cli import main

    assert main(["report", "--from", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().startswith("error: --from must be a folder of one machine's bench JSONs")


@pytest.mark.integration
def test_measure_runs_the_headline_benches_and_renders_the_page(tmp_path, monkeypatch):
    """--measure's wiring on the tiny pair: each bench of names.REPORT_BENCHES as a process, into
    runs/report/<machine>/, then the page beside the nearest stored machine's; a rerun keeps what is written. On 3
    prompts a bench rather than the 26 of the real plan: the wiring, not the sizes (which take ~12 minutes even on
    the tiny pair, the pipeline's drafter and transformers' generate being per-prompt costs)."""
    from ssd import commands, names
    from ssd.bench.machines import this_machine
    from ssd.cli import main

    plan = {"humaneval": ("humaneval:3", "calibrated", names.REPORT_METHODS),
            "humaneval_uniform": ("humaneval:3", "uniform", "ssd-pipeline")}
    monkeypatch.setattr(commands, "REPORT_BENCHES", plan)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(KIT_ROOT))  # the benches' processes import this checkout's kit
    assert main(["report", "--measure", "--pair", "tiny", "--out", "page.md"]) == 0
    folder = tmp_path / names.REPORT_DIR / this_machine()
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"headline_{n}.json" for n in plan)
    text = (tmp_path / "page.md").read_text()
    mine, theirs = text.split("## the nearest stored machine:")  # the measured page first
    assert f"## your results: {this_machine()}" in mine and "| SD over AR | HumanEval | not measured" not in mine
    uniform = next(line for line in mine.splitlines() if line.startswith("| hit rate at B = 4, uniform"))
    assert uniform.endswith("| `headline_humaneval_uniform.json` |")  # the pipeline's own bench at uniform fan-out
    assert (tmp_path / "page.png").exists()
    written = {p.name: p.stat().st_mtime for p in folder.iterdir()}
    assert main(["report", "--measure", "--pair", "tiny", "--out", "page.md"]) == 0
    assert {p.name: p.stat().st_mtime for p in folder.iterdir()} == written


def test_report_measure_runs_its_benches_with_the_forward_asked_into_a_folder_of_their_own(monkeypatch, tmp_path):
    import subprocess
    from types import SimpleNamespace

    from ssd import commands, names
    from ssd.bench.machines import this_machine

    commands_run = []
    monkeypatch.setattr(subprocess, "run", lambda command: commands_run.append(command) or SimpleNamespace(
        returncode=0))
    monkeypatch.chdir(tmp_path)
    folder = commands.measure_headline("tiny", "compiled")
    assert folder == os.path.join(names.REPORT_DIR, "compiled", this_machine())
    assert len(commands_run) == len(names.REPORT_BENCHES)
    assert all(c[c.index("--forward") + 1] == "compiled" and c[c.index("--json") + 1].startswith(folder)
               for c in commands_run)
    assert commands.measure_headline("tiny") == os.path.join(names.REPORT_DIR, this_machine())  # eager: as before


def test_report_refuses_a_forward_without_measure(capsys):
    from ssd.cli import main

    assert main(["report", "--forward", "compiled"]) == 2
    assert "--forward is how --measure's benches run" in capsys.readouterr().err
    assert main(["report", "--measure", "--forward", "jit"]) == 2
    assert "forward must be one of eager, compiled; got 'jit'" in capsys.readouterr().err


def test_pipeline_figures_are_read_only_at_the_settings_their_label_names(tmp_path):
    """Like for like: the pipeline's rows read only files that ran B 4 with calibrated fan-out, as their label says;
    a file at the command line's default B 16 uniform is another figure, not measured here."""
    rates = {"sd-1core": [1.0] * 4, "ssd-pipeline": [1.5] * 4}
    bench(tmp_path / "m", "b16.json", rates, budget=16, fan_out="uniform")
    pipeline = figure(report.page(str(tmp_path / "m")), "pipeline/sd-1core")
    assert pipeline.value == report.NOT_MEASURED and "B 4, calibrated fan-out" in pipeline.what
    bench(tmp_path / "m", "b4.json", rates)
    assert figure(report.page(str(tmp_path / "m")), "pipeline/sd-1core").source == "b4.json"


def test_the_pipelines_batch_rows_read_only_a_study_at_the_settings_their_label_names(pages):
    """Like for like, as the ratio rows: the pipeline's break-even b, the backups' b* and the backup on auto come from
    a study run at B 4 with calibrated fan-out, or read "not measured" (amd-epyc-avx2's batches.csv, which recorded
    neither, and the Intel Xeon's study are not read)."""
    shown = [f for pg in pages for p in pg.precisions for f in pg.figures[p]
             if f.key in ("b/pipeline", "b/star", "b/auto")]
    assert shown and all("B 4, calibrated fan-out" in f.what for f in shown)
    assert all(f.value == report.NOT_MEASURED or f.sample.endswith("; B 4, calibrated fan-out") for f in shown)
    assert any(f.value != report.NOT_MEASURED for f in shown)


def with_hits(path, hit_rate: float) -> None:
    with open(path) as f:
        result = json.load(f)
    for row in result["rows"]:
        row["hit_rate"] = hit_rate if row["method"].startswith("ssd") else None
    with open(path, "w") as f:
        json.dump(result, f)


def test_a_sampled_hit_rate_is_not_the_greedy_figure(tmp_path):
    rows = {"ssd-pipeline": [1.0] * 3, "ar": [1.0] * 3}
    bench(tmp_path / "s", "sampled.json", rows, temperature=0.7)
    with_hits(tmp_path / "s" / "sampled.json", 0.5)
    hit = figure(report.page(str(tmp_path / "s")), "hit/calibrated")
    assert hit.value == report.NOT_MEASURED and hit.what.endswith(", greedy")
    bench(tmp_path / "g", "greedy.json", rows)  # the same rows, greedy: read
    with_hits(tmp_path / "g" / "greedy.json", 0.5)
    assert figure(report.page(str(tmp_path / "g")), "hit/calibrated").value == "0.50"
