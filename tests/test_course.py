"""python -m ssd course: every numbered notebook at its defaults, executed copies written whole or not at all."""
import os

import nbformat
import pytest

from ssd.course.notebooks import course_notebooks, run_course


def notebook(path, source):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("results_csv = ''", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell(source)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


@pytest.mark.integration
def test_the_course_runs_the_numbered_notebooks_in_order_in_their_folder(tmp_path):
    course = tmp_path / "notebooks"
    course.mkdir()
    # Each notebook appends its name to a file beside it: proves the order and that the kernel ran in that folder.
    for name in ["01_b", "00_a"]:
        notebook(course / f"{name}.ipynb", f"open('order.txt', 'a').write('{name} ')\nprint('ran {name}')")
    notebook(course / "scratch.ipynb", "raise RuntimeError('not part of the course')")
    assert [os.path.basename(p) for p in course_notebooks(str(course))] == ["00_a.ipynb", "01_b.ipynb"]
    seconds = run_course(str(course), str(tmp_path / "out"))
    assert list(seconds) == ["00_a.ipynb", "01_b.ipynb"]
    assert (course / "order.txt").read_text() == "00_a 01_b "
    executed = nbformat.read(str(tmp_path / "out" / "01_b.ipynb"), as_version=4)
    assert "ran 01_b" in executed.cells[1].outputs[0].text
    assert sorted(os.listdir(tmp_path / "out")) == ["00_a.ipynb", "01_b.ipynb"]


@pytest.mark.integration
def test_a_failing_notebook_stops_the_course_and_is_kept_as_failed(tmp_path):
    course = tmp_path / "notebooks"
    course.mkdir()
    notebook(course / "00_ok.ipynb", "print('fine')")
    notebook(course / "01_bad.ipynb", "raise ValueError('boom')")
    notebook(course / "02_never.ipynb", "print('never')")
    with pytest.raises(Exception, match="boom"):
        run_course(str(course), str(tmp_path / "out"))
    assert sorted(os.listdir(tmp_path / "out")) == ["00_ok.ipynb", "01_bad.failed.ipynb"]


def test_only_and_an_empty_folder_are_checked(tmp_path):
    with pytest.raises(ValueError, match="notebooks_dir .* holds no notebook"):
        run_course(str(tmp_path), str(tmp_path / "out"))
    notebook(tmp_path / "00_a.ipynb", "1")
    with pytest.raises(ValueError, match="only=\\['07'\\] matches none"):
        run_course(str(tmp_path), str(tmp_path / "out"), only=["07"])
