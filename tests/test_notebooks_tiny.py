"""Every numbered notebook runs top to bottom on the tiny pair, through papermill, as its parameters cell offers:
`pair_name = "tiny"`. The claims a notebook asserts must hold for the pair it ran on (or say which pair they are
about). Each runs in a copy of the course (notebooks, data, sweeps), so nothing it writes touches the repository."""
import os
import pathlib
import shutil

import pytest

from ssd.course import course_notebooks

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
    import papermill

    notebooks = course / "notebooks"
    out = course / f"executed_{name}"
    papermill.execute_notebook(str(notebooks / name), str(out), parameters={"pair_name": "tiny"},
                               cwd=str(notebooks), kernel_name="python3", progress_bar=False)
    assert out.is_file()
