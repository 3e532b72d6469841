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
def test_a_notebook_runs_on_the_tiny_pair(course, name):
    notebooks = course / "notebooks"
    out = course / f"executed_{name}"
    execute_notebook(str(notebooks / name), str(out), parameters={"pair_name": "tiny"})
    assert out.is_file()


def test_notebook_07_shows_stored_benches_whose_auto_timings_differ_and_measures_nothing(course, tmp_path):
    """A fresh machine times auto's candidate precisions anew: its stored benches must still be recognised (by the
    pair, the precisions and the kind of machine), shown, and never re-measured at the notebook's defaults."""
    import json
    import re

    from ssd.models.loading import load_pair

    precision = load_pair("tiny").precisions.as_dict() | {
        "reason": "auto: timed on another day (float32 1013 ms, bfloat16 467 ms)",
        "measured_ms": {"target": {"float32": 1013.2, "bfloat16": 467.5}, "draft": {"int8": 91.6}}}
    stored = {}
    for method, name in (("sd", "autotune_sd_{set}"), ("ssd-pipeline", "autotune_pipeline_{set}"),
                         ("ssd-pipeline auto", "autotune_pipeline_auto_{set}")):
        for s in ("humaneval", "prose"):
            source = ROOT / "data" / "intel-xeon-amx" / f"{name.format(set=s)}.json"
            if source.exists():
                result = json.loads(source.read_text())
                result["args"]["pair"], result["precision"] = "tiny", precision
                (tmp_path / source.name).write_text(json.dumps(result))
        stored[method] = str(tmp_path / f"{name}.json")
    out = tmp_path / "executed_07.ipynb"
    execute_notebook(str(course / "notebooks" / "07_autotune.ipynb"), str(out),
                     parameters={"pair_name": "tiny", "measure_missing": False, "stored": stored})
    printed = "".join("".join(o.get("text", "")) for c in json.loads(out.read_text())["cells"] for o in c.get("outputs", []))
    assert "measured here" not in printed and "not on tiny" not in printed
    for s in ("humaneval", "prose"):
        for name in ("autotune_sd", "autotune_pipeline"):
            assert re.search(re.escape(str(tmp_path / f"{name}_{s}.json")) + r" \d+ answers", printed), (name, s)
