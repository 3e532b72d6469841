"""python -m ssd course: every numbered notebook at its defaults, executed copies written whole or not at all; a
user's run writes every file under its out folder, the stored run rewrites the notebooks in place."""
import json
import os
import pathlib

import nbformat
import pytest

from ssd.course.notebooks import (OUTPUTS, course_notebooks, course_parameters, in_place, outputs, report_command,
                                  run_course)


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


def test_a_failed_or_running_copy_beside_the_course_is_no_notebook_of_it(tmp_path):
    """A run with --out notebooks leaves NAME.failed.ipynb in the course's own folder: the next run reruns NAME
    alone, not the failed copy as a notebook of its own too."""
    for name in ("07_auto.ipynb", "07_auto.failed.ipynb", "07_auto.running.ipynb", "08_b.ipynb"):
        notebook(tmp_path / name, "1")
    assert [os.path.basename(p) for p in course_notebooks(str(tmp_path))] == ["07_auto.ipynb", "08_b.ipynb"]


def test_only_and_an_empty_folder_are_checked(tmp_path):
    with pytest.raises(ValueError, match="notebooks_dir .* holds no notebook"):
        run_course(str(tmp_path), str(tmp_path / "out"))
    notebook(tmp_path / "00_a.ipynb", "1")
    with pytest.raises(ValueError, match="only=\\['07'\\] matches none"):
        run_course(str(tmp_path), str(tmp_path / "out"), only=["07"])


# ---- a user's run: every file under its out folder -------------------------------------------------------------

ROOT = pathlib.Path(__file__).resolve().parent.parent
COURSE = course_notebooks(str(ROOT / "notebooks"))


def test_a_users_run_points_every_output_a_notebook_declares_under_its_out_folder(tmp_path):
    out = tmp_path / "runs" / "course"
    given = outputs(str(out), "some-machine")
    assert given == {"figures_dir": str(out / "figures"), "results_dir": str(out / "results" / "some-machine"),
                     "demo_dir": str(out / "demo")}
    passed = {os.path.basename(nb)[:2]: course_parameters(nb, given) for nb in COURSE}
    for number, parameters in passed.items():
        assert all(pathlib.Path(v).is_relative_to(out) for v in parameters.values()), (number, parameters)
    assert "results_dir" in passed["05"] and "demo_dir" in passed["06"]
    assert sum("figures_dir" in p for p in passed.values()) >= 7


def defaults_of(notebook: str, course_out: str | None) -> dict:
    """The values a notebook's parameters cell gives, as its kernel would compute them with SSD_COURSE_OUT set to
    course_out (or unset); defaults that read other parameters (measure_missing, say) are left out."""
    from unittest import mock

    import papermill

    values = {}
    with mock.patch.dict(os.environ):
        os.environ.pop("SSD_COURSE_OUT", None)
        if course_out is not None:
            os.environ["SSD_COURSE_OUT"] = course_out
        for name, p in papermill.inspect_notebook(notebook).items():
            try:
                values[name] = eval(p["default"], {"os": os})
            except NameError:
                continue
    return values


WRITES = ("../figures", "../runs", "../data/demo")  # a default under one of these writes into the checkout


def test_no_notebook_default_that_writes_into_the_repository_is_left_to_a_users_run(tmp_path):
    """A default under ../figures, ../runs or ../data/demo writes into the checkout; a user's run must replace each.
    (../data itself is read: the kit's stored results.)"""
    given = outputs(str(tmp_path / "out"), "some-machine")
    for nb in COURSE:
        defaults = defaults_of(nb, None)
        into_repo = {name for name, value in defaults.items() if isinstance(value, str) and value.startswith(WRITES)}
        assert into_repo <= set(course_parameters(nb, given)), (nb, into_repo)
    assert any(defaults_of(nb, None).get("figures_dir") == "../figures" for nb in COURSE)  # the stored run's


def test_with_ssd_course_out_set_no_notebook_default_writes_into_the_repository(tmp_path):
    """What make test's nbval runs: the stored notebooks at their defaults, with SSD_COURSE_OUT (tests/conftest.py)
    a temporary folder; every default that would write into the checkout goes under it instead."""
    out = str(tmp_path / "course-out")
    declared = 0
    for nb in COURSE:
        defaults = defaults_of(nb, out)
        assert not {n for n, v in defaults.items() if isinstance(v, str) and v.startswith(WRITES)}, (nb, defaults)
        for name in set(defaults) & set(OUTPUTS):
            if defaults[name] is not None:
                declared += 1
                assert pathlib.Path(defaults[name]).is_relative_to(out), (nb, name, defaults[name])
    assert declared >= 9  # figures_dir in 01-09, demo_dir in 06


def test_the_stored_run_is_the_notebooks_own_folder_and_takes_no_parameters(tmp_path):
    notebook(tmp_path / "00_a.ipynb", "1")
    assert in_place(str(tmp_path), str(tmp_path) + "/") and not in_place(str(tmp_path), str(tmp_path / "out"))
    with pytest.raises(ValueError, match="cannot be given to the stored run"):
        run_course(str(tmp_path), str(tmp_path), parameters={"pair_name": "tiny"})


def test_the_page_is_rendered_from_the_machines_results_folder():
    command = report_command("runs/course", "runs/report.md", "amd-epyc-avx2")
    assert command[1:4] == ["-m", "ssd", "report"] and command[-2:] == ["--out", "runs/report.md"]
    assert command[command.index("--from") + 1] == str(pathlib.Path("runs/course/results/amd-epyc-avx2").resolve())


def files_of(root: pathlib.Path) -> dict:
    """Every file of the checkout but git's own and the caches Python and pytest keep, with its size and time."""
    skip = {".git", ".venv", "__pycache__", ".pytest_cache", ".ipynb_checkpoints"}
    found = {}
    for folder, folders, names in os.walk(root):
        folders[:] = [f for f in folders if f not in skip and not f.endswith(".egg-info")]
        for name in names:
            stat = os.stat(os.path.join(folder, name))
            found[os.path.relpath(os.path.join(folder, name), root)] = (stat.st_size, stat.st_mtime_ns)
    return found


# In the worker that runs nbval, never beside it: nbval executes the notebooks in place, writing figures/ and data/demo/
@pytest.mark.integration
@pytest.mark.xdist_group("course")
def test_a_users_run_on_the_tiny_pair_writes_only_under_its_out_folder(tmp_path):
    """00 and 05 of the course itself, as `make run` runs them: the checkout's files (tracked or ignored) untouched,
    and notebook 05's bench kept under OUT/results/<machine> as a bench JSON a stored bench's reader takes."""
    import subprocess

    from ssd.bench.machines import this_machine
    from ssd.bench.records import load_rows

    status = ["git", "-C", str(ROOT), "status", "--porcelain"]
    before, status_before = files_of(ROOT), subprocess.run(status, capture_output=True, text=True).stdout
    out = tmp_path / "course"
    seconds = run_course(str(ROOT / "notebooks"), str(out), only=["00", "05"], parameters={"pair_name": "tiny"})
    assert list(seconds) == ["00_quickstart.ipynb", "05_two_device_pipeline.ipynb"]
    assert files_of(ROOT) == before
    assert subprocess.run(status, capture_output=True, text=True).stdout == status_before
    bench = out / "results" / this_machine() / "pipeline_b1.json"
    saved = json.loads(bench.read_text())
    assert {"args", "environment", "precision", "rows", "summary"} <= set(saved) and "spans" not in saved
    assert saved["args"]["pair"] == "tiny" and saved["environment"]["kind"] == this_machine()
    assert set(load_rows(str(bench)).method) == {"ar", "sd", "sd-1core", "ssd-pipeline"}
    assert sorted(p.name for p in (out / "figures").iterdir()) == ["05_latency_profile.png", "05_timeline.png",
                                                                    "05_wall_clock.png"]


def test_a_notebooks_bench_is_kept_as_the_bench_command_keeps_one(tmp_path):
    """What notebook 05 keeps for the user's page reads back as a stored bench does (rows, summary, this pair at these
    precisions on this kind of machine), names its settings as the command line does, and leaves the result whole."""
    from ssd.bench.prompts import load_prompts
    from ssd.analysis.stored_files import stored_bench
    from ssd.bench.records import load_rows
    from ssd.bench.run import run_bench
    from ssd.core.speculation import SSDConfig
    from ssd.course import measured
    from ssd.models.loading import load_pair

    pair, config = load_pair("tiny"), SSDConfig(k=2, max_new_tokens=4, budget=2)
    result = run_bench(pair, load_prompts("humaneval[0:1]"), ["ar", "sd"], config, progress=False)
    path = str(tmp_path / "results" / "pipeline_b1.json")
    settings = dict(notebook="05_two_device_pipeline", prompts="humaneval[0:1]", methods=["ar", "sd"], batch_size=1,
                    device="cpu", target_dtype="auto", draft_dtype="auto")
    assert measured.save_bench(path, result, pair, config, **settings) == path
    saved = json.loads(pathlib.Path(path).read_text())
    assert {"args", "environment", "precision", "rows", "summary", "profile"} <= set(saved) and "spans" in result
    assert "spans" not in saved and saved["profile"] is None
    named = {"methods": "ar,sd", "fan_out": "uniform", "k": 2, "budget": 2, "pair": "tiny", "prompts": "humaneval[0:1]"}
    assert saved["args"] | named == saved["args"]
    assert list(load_rows(path).method.unique()) == ["ar", "sd"]
    assert stored_bench(path, pair)["elsewhere"] is None
    assert os.listdir(tmp_path / "results") == ["pipeline_b1.json"]  # no temporary file left beside it
    with pytest.raises(ValueError, match="path must end in .json"):
        measured.save_bench(str(tmp_path / "bench.csv"), result, pair, config, **settings)
