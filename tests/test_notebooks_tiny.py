"""Every numbered notebook runs top to bottom on the tiny pair, through papermill, as its parameters cell offers:
`pair_name = "tiny"`. The claims a notebook asserts must hold for the pair it ran on (or say which pair they are
about). Each runs in a copy of the course (notebooks, data, sweeps), so nothing it writes touches the repository."""
import os
import pathlib
import shutil

import pytest

from ssd.course.notebooks import course_notebooks
from ssd.course.kernel import execute_notebook

pytestmark = pytest.mark.integration  # papermill's kernels

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = [os.path.basename(p) for p in course_notebooks(str(ROOT / "notebooks"))]


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    copy = tmp_path_factory.mktemp("course")
    for folder in ("notebooks", "data", "sweeps"):
        shutil.copytree(ROOT / folder, copy / folder)
    (copy / "figures").mkdir()
    return copy


def test_the_course_is_all_here():
    assert len(NOTEBOOKS) >= 7 and NOTEBOOKS[0].startswith("00_")


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_a_notebook_runs_on_the_tiny_pair(course, name, monkeypatch):
    # its figures and 06's demo go into the copy, as the notebooks' defaults have it (not make test's SSD_COURSE_OUT,
    # which nbval's run of the same notebook writes into)
    monkeypatch.delenv("SSD_COURSE_OUT", raising=False)
    notebooks = course / "notebooks"
    out = course / f"executed_{name}"
    execute_notebook(str(notebooks / name), str(out), parameters={"pair_name": "tiny"})
    assert out.is_file()


def test_notebook_07_shows_another_machines_benches_at_other_precisions_and_measures_nothing(course, tmp_path):
    """Issue 49: on a machine whose kind and auto precision differ from the stored benches' (and which times auto's
    candidate precisions anew), notebook 07 at its defaults shows the nearest stored machine's benches, says where and
    at which precisions they were measured, draws every figure with that said under it, and re-measures nothing."""
    import json
    import re

    from ssd.models.loading import load_pair

    tiny = load_pair("tiny").precisions
    other = "bfloat16" if tiny.target != "bfloat16" else "float16"
    precision = tiny.as_dict() | {
        "target": other, "reason": "auto: timed on another day (float32 1013 ms, bfloat16 467 ms)",
        "measured_ms": {"target": {"float32": 1013.2, "bfloat16": 467.5}, "draft": {"int8": 91.6}}}
    folder = tmp_path / "data" / "intel-xeon-amx"  # the stored benches of the Intel Xeon with AMX, as the tiny pair's
    folder.mkdir(parents=True)
    for source in sorted((ROOT / "data" / "intel-xeon-amx").glob("autotune_*.json")):
        result = json.loads(source.read_text())
        result["args"]["pair"], result["precision"] = "tiny", precision
        (folder / source.name).write_text(json.dumps(result))
    out, figures = tmp_path / "executed_07.ipynb", tmp_path / "figures"
    execute_notebook(str(course / "notebooks" / "07_autotune.ipynb"), str(out),
                     parameters={"pair_name": "tiny", "measure_missing": False, "data_dir": str(tmp_path / "data"),
                                 "figures_dir": str(figures)})
    printed = "".join("".join(o.get("text", "")) for c in json.loads(out.read_text())["cells"] for o in c.get("outputs", []))
    assert "measured here" not in printed.replace("not measured here", "") and "not on tiny" not in printed
    for s in ("humaneval", "prose"):
        for name in ("autotune_sd", "autotune_pipeline"):
            # each bench's Source: the file, the machine that measured it, its date and commit; then its answers
            line = re.escape(f"intel-xeon-amx/{name}_{s}.json: measured on intel-xeon-amx") + r".*; \d+ answers"
            assert re.search(line, printed), (name, s)
    assert f"target {other}, draft {tiny.draft} · stored, not measured here" in printed  # where, at which precisions
    assert f"at target {other}, draft {tiny.draft} (this pair here: {tiny.label})" in printed
    assert "checked on the stored benches" in printed  # the claims held on the benches shown
    assert "predicted for this machine" in printed  # no profile of the tiny pair kept there: this one's, said so
    assert sorted(p.name for p in figures.glob("07_*.png")) == ["07_sd_k_code.png", "07_sd_k_prose.png",
                                                               "07_ssd_surface_code.png", "07_ssd_surface_prose.png"]
