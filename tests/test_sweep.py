"""The papermill sweep: grid checks, point ids, every point's rows exactly once even across a SIGKILL, --jobs, the CLI.

Fixture notebooks are built here with nbformat; they import pandas only (importing ssd costs seconds per kernel).
"""
import os
import re
import signal
import subprocess
import sys
import time

import nbformat
import pandas as pd
import pytest
import yaml

from ssd.course import sweep
from ssd.cli import main

# papermill.inspect_notebook cannot parse the last line (an "=" in its comment); the sweep must still accept sleep_s.
PARAMETERS = 'x = 1\nlabel = "a"\nresults_csv = ""\nsleep_s = 0.0  # 0 = no sleep'
# Two rows a point; `label` is the notebook's own column, so the sweep must keep it rather than add the parameter.
BODY = '''import os, sys, time
import pandas as pd
time.sleep(sleep_s)
if x < 0:
    raise ValueError(f"x must be >= 0, got {x}")
frame = pd.DataFrame({"row": [0, 1], "y": [10 * x, 10 * x + 1], "label": label.upper(),
                      "python": sys.executable, "omp": os.environ.get("OMP_NUM_THREADS"), "slept": sleep_s})
frame.to_csv(results_csv + ".tmp", index=False)
os.replace(results_csv + ".tmp", results_csv)  # atomic, as ssd.files.write_csv does
'''


def make_notebook(path, parameters=PARAMETERS):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(parameters)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, nbformat.v4.new_code_cell(BODY)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))
    return str(path)


def write_grid(directory, notebook=None, **spec):
    spec = {"name": "demo", "notebook": notebook or make_notebook(directory / "nb.ipynb"),
            "parameters": {"label": "b"}, "grid": {"x": [1, 2, 3]}} | spec
    path = directory / "grid.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in spec.items() if v is not None}, sort_keys=False))
    return str(path)


def dirs(directory):
    return {"data_dir": str(directory / "data"), "runs_dir": str(directory / "runs")}


def data(directory):
    return pd.read_csv(directory / "data" / "demo.csv")


@pytest.mark.parametrize(
    "spec,message",
    [
        ({"name": None}, "name is missing"),
        ({"grid": None}, "grid is missing"),
        ({"name": "a b"}, "name must match [A-Za-z0-9_-]+"),
        ({"notebook": "nowhere.ipynb"}, "notebook must be the path of an existing file"),
        ({"gird": {"x": [1]}}, "unknown key(s) gird"),
        ({"grid": {"x": 1}}, "grid.x must be a non-empty list"),
        ({"grid": {"x": []}}, "grid.x must be a non-empty list"),
        ({"grid": {"x": [1, 1]}}, "grid.x repeats a value"),
        ({"parameters": {"x": 1}}, "x is in both parameters and grid"),
        ({"grid": {"z": [1]}}, "parameter 'z' is not in the parameters cell"),
        ({"parameters": {"results_csv": "a.csv"}}, "results_csv is set by the sweep"),
        ({"parameters": {"point_id": "a"}}, "point_id is set by the sweep"),
    ],
)
def test_bad_grids_fail_fast_naming_the_key(tmp_path, spec, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        sweep.load_grid(write_grid(tmp_path, **spec))


def test_unknown_parameter_lists_the_allowed_ones_and_results_csv_is_required(tmp_path):
    with pytest.raises(ValueError, match="allowed: x, label, sleep_s"):
        sweep.load_grid(write_grid(tmp_path, grid={"z": [1]}))
    notebook = make_notebook(tmp_path / "old.ipynb", parameters="x = 1")
    with pytest.raises(ValueError, match="has no results_csv parameter"):
        sweep.load_grid(write_grid(tmp_path, notebook=notebook, parameters=None))


def test_point_ids_are_readable_deterministic_and_unique(tmp_path):
    spec = {"grid": {"label": ["humaneval[0:8]", "prose[0:8]"], "x": [-1, 1]}, "parameters": {"sleep_s": 0.5}}
    points = sweep.load_grid(write_grid(tmp_path, **spec)).points()
    ids = [p.point_id for p in points]
    assert ids == [p.point_id for p in sweep.load_grid(write_grid(tmp_path, **spec)).points()]
    assert len(set(ids)) == 4 and all(re.fullmatch(r"[A-Za-z0-9._-]+", i) for i in ids)
    assert ids[0].startswith("humaneval-0-8_m1_") and ids[3].startswith("prose-0-8_1_")
    assert points[0].parameters == {"sleep_s": 0.5, "label": "humaneval[0:8]", "x": -1}
    # A fixed parameter is part of the hash: changing it makes new points, never a silent reuse of old rows.
    other = sweep.point_id({"x": 1}, {"x": 1, "sleep_s": 0.0})
    assert other != sweep.point_id({"x": 1}, {"x": 1, "sleep_s": 0.5}) and other.startswith("1_")


def test_jobs_must_be_at_least_one(tmp_path, capsys):
    assert main(["sweep", write_grid(tmp_path), "--jobs", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: jobs must be an integer >= 1")


def test_kernels_share_the_cores_the_caller_allows(monkeypatch):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert sweep.kernel_threads(1) == cores and sweep.kernel_threads(cores + 1) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a pytest worker's share: its kernels must not take the others' cores
    assert sweep.kernel_threads(1) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "not a number")
    assert sweep.kernel_threads(1) == cores


@pytest.mark.integration
def test_a_notebook_that_takes_figures_dir_saves_each_points_figures_beside_its_notebook(tmp_path):
    body = ("import os, pandas as pd\nos.makedirs(figures_dir, exist_ok=True)\n"
            "open(os.path.join(figures_dir, 'f.png'), 'w').write(str(x))\n"
            "pd.DataFrame({'figures_dir': [figures_dir]}).to_csv(results_csv, index=False)\n")
    notebook = make_notebook(tmp_path / "figs.ipynb", 'x = 1\nresults_csv = ""\nfigures_dir = "default"')
    nb = nbformat.read(notebook, as_version=4)
    nb.cells[1].source = body
    nbformat.write(nb, notebook)
    with pytest.raises(ValueError, match="figures_dir is set by the sweep"):
        sweep.load_grid(write_grid(tmp_path, notebook=notebook, parameters={"figures_dir": "elsewhere"}))
    grid = sweep.load_grid(write_grid(tmp_path, notebook=notebook, parameters=None, grid={"x": [1, 2]}))
    assert sweep.run_sweep(grid, **dirs(tmp_path)) == []
    runs = tmp_path / "runs" / "demo"
    for point in grid.points():  # figures_dir is per point, and not part of the point's id or its columns
        folder = runs / f"{point.point_id}_figures"
        assert (folder / "f.png").read_text() == str(point.parameters["x"])
    assert sorted(data(tmp_path).figures_dir) == sorted(str(runs / f"{p.point_id}_figures") for p in grid.points())
    assert not (tmp_path / "default").exists()  # the notebook's default folder was left alone


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    directory = tmp_path_factory.mktemp("swept")
    grid = sweep.load_grid(write_grid(directory, parameters={"label": "b", "sleep_s": 1e-5}))
    assert sweep.run_sweep(grid, jobs=1, **dirs(directory)) == []
    return directory, grid


@pytest.mark.integration
def test_a_sweep_records_every_point_once_with_its_parameters(swept):
    directory, grid = swept
    frame = data(directory)
    ids = [p.point_id for p in grid.points()]
    assert sorted(frame.point_id) == sorted(ids * 2)  # two rows a point
    assert list(frame.columns[:3]) == ["point_id", "sleep_s", "x"] and sorted(frame.y) == [10, 11, 20, 21, 30, 31]
    assert (frame.y // 10 == frame.x).all()
    assert list(frame.columns).count("label") == 1 and set(frame.label) == {"B"}  # the notebook's column wins
    assert set(frame.python) == {sys.executable}  # the kernel is this environment's python
    assert set(frame.omp) == {sweep.kernel_threads(1)}  # the kernel ran at the share it was given
    assert set(frame.slept) == {1e-5} and set(frame.sleep_s) == {1e-5}  # a float, not the string "1e-05"
    assert list(frame.columns[-5:]) == ["machine", "device_name", "flags", "commit", "date"]  # no precision to say
    runs = directory / "runs" / "demo"
    assert sorted(os.listdir(runs)) == sorted([f"{i}.ipynb" for i in ids] + [f"{i}.csv" for i in ids])


@pytest.mark.integration
def test_a_rerun_runs_nothing(swept, monkeypatch):
    directory, grid = swept
    before = (directory / "data" / "demo.csv").read_bytes()
    monkeypatch.setattr(sweep, "_Run", lambda *a: pytest.fail("a finished point ran again"))
    assert sweep.run_sweep(grid, jobs=1, **dirs(directory)) == []
    assert (directory / "data" / "demo.csv").read_bytes() == before


@pytest.mark.integration
def test_two_jobs_give_the_same_rows(swept, tmp_path):
    directory, grid = swept
    assert sweep.run_sweep(grid, jobs=2, **dirs(tmp_path)) == []
    one, two = data(directory), data(tmp_path)
    assert set(two.omp) == {sweep.kernel_threads(2)}
    key = ["point_id", "row"]
    varies = ["omp", "date"]  # the threads each kernel was given, and when each point finished
    pd.testing.assert_frame_equal(one.drop(columns=varies).sort_values(key).reset_index(drop=True),
                                  two.drop(columns=varies).sort_values(key).reset_index(drop=True))


@pytest.mark.integration
def test_a_failing_point_is_reported_not_recorded_and_retried_later(tmp_path, capsys):
    grid_file = write_grid(tmp_path, grid={"x": [-1, 2]})
    bad, good = (p.point_id for p in sweep.load_grid(grid_file).points())
    argv = ["sweep", grid_file, "--data-dir", str(tmp_path / "data"), "--runs-dir", str(tmp_path / "runs")]
    assert main(argv) == 1
    err = capsys.readouterr().err
    failed_notebook = tmp_path / "runs" / "demo" / f"{bad}.failed.ipynb"
    assert f"point {bad} failed: ValueError: x must be >= 0, got -1" in err and str(failed_notebook) in err
    assert failed_notebook.exists() and "1 point(s) failed" in err and err.rstrip().endswith(bad)
    assert set(data(tmp_path).point_id) == {good}
    assert main(argv + ["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"todo  {bad}" in out and f"done  {good}" in out and "1 of 2 points to run" in out


def test_a_kernel_of_another_python_is_refused(tmp_path, monkeypatch):
    spec = tmp_path / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text('{"argv": ["/elsewhere/bin/python", "-m", "ipykernel_launcher", "-f", '
                                      '"{connection_file}"], "display_name": "other", "language": "python"}')
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    with pytest.raises(ValueError, match="runs /elsewhere/bin/python, not this environment's"):
        sweep.run_sweep(sweep.load_grid(write_grid(tmp_path)), **dirs(tmp_path))


def descendants(pid):
    """Process ids below pid, from /proc (kernels run in their own session, so a process group would miss them)."""
    children = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
        except OSError:  # the process ended while we looked
            continue
    found, frontier = [], [pid]
    while frontier:
        frontier = [c for p in frontier for c in children.get(p, [])]
        found += frontier
    return found


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read()
    except OSError:
        return ""


def wait_for(condition, timeout=60):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.mark.integration
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads child processes from /proc")
def test_killed_sweeps_resume_with_every_point_exactly_once(tmp_path, capsys):
    grid_file = write_grid(tmp_path, grid={"x": [1, 2, 3]}, parameters={"label": "b", "sleep_s": 0.5})
    ids = {p.point_id for p in sweep.load_grid(grid_file).points()}
    argv = [sys.executable, "-m", "ssd", "sweep", grid_file, "--data-dir", str(tmp_path / "data"),
            "--runs-dir", str(tmp_path / "runs")]
    csv = tmp_path / "data" / "demo.csv"

    def done():
        return set(pd.read_csv(csv).point_id) if csv.exists() else set()

    # SIGKILL the sweep and its papermill children (its process group) once some but not all points are in.
    first = subprocess.Popen(argv, start_new_session=True, stderr=subprocess.DEVNULL)
    wait_for(lambda: done() or first.poll() is not None)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert 1 <= len(done()) < len(ids)
    assert main(argv[3:] + ["--dry-run"]) == 0  # in process: `python -m ssd sweep` runs twice below already
    listing = capsys.readouterr().out
    assert {line.split()[1] for line in listing.splitlines() if line.startswith("done  ")} == done()
    assert f"{len(ids) - len(done())} of {len(ids)} points to run" in listing
    # SIGTERM a second sweep once its kernel runs: it stops its children, kernels included, and exits 130.
    second = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: any("ipykernel" in cmdline(p) for p in descendants(second.pid) if alive(p)))
    below = descendants(second.pid)
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=30) == 130 and "sweep interrupted" in second.stderr.read()
    wait_for(lambda: not any(alive(p) for p in below), timeout=10)
    # A third run finishes the rest; every point lands exactly once.
    assert sweep.run_sweep(sweep.load_grid(grid_file), **dirs(tmp_path)) == []
    frame = data(tmp_path)
    assert set(frame.point_id) == ids and (frame.groupby("point_id").size() == 2).all()
    assert set(frame.slept) == {0.5}  # injected, though papermill could not parse the line that sets it
    assert not frame.duplicated(["point_id", "row"]).any()


def test_the_notebook_path_is_relative_to_the_grid_file(tmp_path, monkeypatch):
    (tmp_path / "grids").mkdir()
    make_notebook(tmp_path / "nb.ipynb")
    grid_path = tmp_path / "grids" / "grid.yaml"
    grid_path.write_text(yaml.safe_dump({"name": "demo", "notebook": "../nb.ipynb", "grid": {"x": [1]}}))
    monkeypatch.chdir(tmp_path / "grids")
    assert sweep.load_grid("grid.yaml").notebook == str(tmp_path / "nb.ipynb")
    monkeypatch.chdir(tmp_path)
    assert sweep.load_grid("grids/grid.yaml").notebook == str(tmp_path / "nb.ipynb")


def test_with_parameters_fixes_more_and_refuses_a_varied_or_unknown_one(tmp_path):
    grid = sweep.load_grid(write_grid(tmp_path))
    fixed = grid.with_parameters(sleep_s=0.25)
    assert [p.parameters["sleep_s"] for p in fixed.points()] == [0.25] * 3
    assert {p.point_id for p in fixed.points()}.isdisjoint(p.point_id for p in grid.points())  # new points
    with pytest.raises(ValueError, match="x is varied by the grid 'demo'"):
        grid.with_parameters(x=5)
    with pytest.raises(ValueError, match="parameter 'pair' is not in the parameters cell"):
        grid.with_parameters(pair="tiny")


def test_each_row_records_the_machine_its_precision_the_commit_and_the_date(tmp_path):
    from ssd.bench import machines
    from ssd.models.capability import cpu_flags

    notebook = make_notebook(tmp_path / "nb.ipynb", PARAMETERS + '\ntarget_dtype = "auto"\ndraft_dtype = "int8"\n'
                                                                  'device = "cpu"')
    assert sweep.notebook_defaults(notebook) == {"x": 1, "label": "a", "results_csv": "", "sleep_s": 0.0,
                                                 "target_dtype": "auto", "draft_dtype": "int8", "device": "cpu"}
    point = sweep.Point("p", {"x": 2, "draft_dtype": "float32"})
    rows = sweep.with_provenance(pd.DataFrame({"y": [1, 2]}), notebook, point)
    assert list(rows.columns) == ["y", *sweep.PROVENANCE]  # after the notebook's own columns
    assert set(rows.machine) == {machines.this_machine()} and set(rows.commit) == {machines.commit()}
    assert set(rows["flags"]) == {";".join(cpu_flags())} and rows.date[0].startswith("20")
    # the rows do not say what auto chose: the precision as asked, the point's over the notebook's default
    assert set(rows.target_dtype) == {"auto"} and set(rows.draft_dtype) == {"float32"}
    # a precision label in the rows is what auto resolved to, row by row
    labelled = pd.DataFrame({"precision": ["target bfloat16, draft int8", "target float32, draft float32"]})
    rows = sweep.with_provenance(labelled, notebook, point)
    assert list(rows.target_dtype) == ["bfloat16", "float32"] and list(rows.draft_dtype) == ["int8", "float32"]
    # a column the notebook wrote under one of these names is kept as it wrote it
    own = pd.DataFrame({"machine": ["AMD EPYC (2 cores), AVX2"], "target_dtype": ["bfloat16"]})
    rows = sweep.with_provenance(own, notebook, point)
    assert rows.machine[0] == "AMD EPYC (2 cores), AVX2" and rows.target_dtype[0] == "bfloat16"
    assert list(rows.columns).count("machine") == 1


def test_a_table_stored_before_the_provenance_columns_still_resumes(tmp_path, monkeypatch, capsys):
    """Rows appended to a CSV written before each row recorded its machine, commit and date get those columns at the
    end; the old rows keep theirs, blank in the new ones, and the points done stay done."""
    data_csv = tmp_path / "demo.csv"
    notebook = make_notebook(tmp_path / "nb.ipynb")
    grid = sweep.load_grid(write_grid(tmp_path, grid={"x": [1, 2]}, parameters=None))
    done, point = grid.points()
    data_csv.write_text(f"point_id,x,row,y\n{done.point_id},1,0,10\n{done.point_id},1,1,11\n")
    rows = sweep.with_provenance(pd.DataFrame({"row": [0], "y": [20]}), notebook, point)
    sweep.append_point(str(data_csv), point, rows)
    frame = pd.read_csv(data_csv, dtype=str, keep_default_na=False)
    assert list(frame.columns) == ["point_id", "x", "row", "y", "machine", "device_name", "flags", "commit", "date"]
    assert list(frame.point_id) == [done.point_id] * 2 + [point.point_id] and list(frame.y) == ["10", "11", "20"]
    assert list(frame.commit[:2]) == ["", ""] and frame.commit[2] and frame.machine[2]
    monkeypatch.setattr(sweep, "_Run", lambda *a: pytest.fail("a point ran though both are done"))
    assert sweep.run_sweep(grid, data_dir=str(tmp_path), runs_dir=str(tmp_path / "runs")) == []
    assert sweep.run_sweep(grid, data_dir=str(tmp_path), runs_dir=str(tmp_path / "runs"), dry_run=True) == []
    assert "0 of 2 points to run" in capsys.readouterr().out
