"""Papermill over a parameter grid, resumable: `python -m ssd sweep GRID.yaml [--jobs N] [--dry-run]`.

A grid file names a notebook and the parameters to vary (see `load_grid`). Each point of the cartesian product runs
the notebook once, through papermill in its own subprocess (`python -m ssd.execute`) on this environment's python3
kernel, with the notebook's folder as the working directory (as in Jupyter and nbval).

Protocol with the notebook: its `parameters` cell must define `results_csv`. The sweep sets it to
`<runs-dir>/<name>/<point_id>.csv` (an absolute path); the notebook's last step writes its tidy result frame there,
atomically (ssd.files.write_csv), at least one row. The sweep then adds a `point_id` column and one column per
parameter (a column the notebook already wrote under a parameter's name is kept as the notebook wrote it) and
appends the rows to `<data-dir>/<name>.csv`. All values travel as the text the notebook wrote. Each row also records
where and how it was measured (``PROVENANCE``, ``with_provenance``): the machine's kind (its folder in data/), the
device's name, the CPU's recorded flags, each model's precision as the notebook resolved it, the kit's commit and the
date; a column the notebook wrote under one of those names is kept. A notebook whose
parameters cell also defines `figures_dir` gets `<runs-dir>/<name>/<point_id>_figures/`, so that the points' figures
sit beside their notebooks instead of overwriting the notebook's default figures (those docs/findings.md shows) in
`figures/`.

Exactly once: the points done are the point_ids in `<data-dir>/<name>.csv`, and only the parent process appends to
it, one point at a time, by rewriting the whole file under a temporary name and renaming it. A sweep killed at any
moment (even SIGKILL) therefore holds every finished point's rows once or not at all, and a restart runs the rest.
Executed notebooks are written to `<point_id>.running.ipynb` and renamed to `<point_id>.ipynb` on success, or to
`<point_id>.failed.ipynb` (with `<point_id>.log`) on failure; failed points are not appended and a rerun retries
them. Killing only the parent with SIGKILL leaves its running papermill children to finish their current point;
their output is never appended. Kill the process group (as Ctrl-C in a terminal does) to stop them as well.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import hashlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import nbformat
import pandas as pd
import yaml
from tqdm.auto import tqdm

from ..checks import check_at_least
from ..files import write_csv

KEYS = ("name", "notebook", "parameters", "grid")
SET_BY_SWEEP = ("results_csv", "figures_dir", "point_id")  # set for each point, never by a grid file
# What every row records beside its numbers (data/README.md): a result is only as good as the machine it names.
PROVENANCE = ("machine", "device_name", "flags", "target_dtype", "draft_dtype", "commit", "date")
PRECISION_LABEL = re.compile(r"target (\S+), draft (\S+)")  # ssd.models.auto_precision.Precisions.label


@dataclasses.dataclass(frozen=True)
class Grid:
    name: str
    notebook: str  # resolved: the grid file gives it relative to the grid file's own folder
    parameters: dict  # the same for every point
    grid: dict  # key -> non-empty list; points are their cartesian product, in this order

    def with_parameters(self, **fixed) -> Grid:
        """The same grid with more fixed parameters (a notebook running a grid on the pair it was given, say);
        each must be a parameter of the grid's notebook and not one the grid varies."""
        both = sorted(set(fixed) & set(self.grid))
        if both:
            raise ValueError(f"{', '.join(both)} is varied by the grid {self.name!r}; it cannot also be fixed")
        check_notebook_parameters(self.notebook, list(fixed))
        return dataclasses.replace(self, parameters=self.parameters | fixed)

    def points(self) -> list[Point]:
        """The cartesian product of the grid's lists, in the file's order, merged with the fixed parameters."""
        result = []
        for combo in itertools.product(*self.grid.values()):
            values = dict(zip(self.grid, combo))
            parameters = self.parameters | values
            result.append(Point(point_id(values, parameters), parameters))
        return result


@dataclasses.dataclass(frozen=True)
class Point:
    point_id: str
    parameters: dict  # fixed and grid parameters, without results_csv


def load_grid(path: str) -> Grid:
    """Read and check a grid file, failing on the first problem with a message that names the key."""
    with open(path) as f:
        spec = yaml.safe_load(f)
    if not isinstance(spec, dict):
        raise ValueError(f"{path} must be a YAML mapping with keys {', '.join(KEYS)}")
    unknown = sorted(set(spec) - set(KEYS))
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(map(str, unknown))} in {path}; allowed: {', '.join(KEYS)}")
    for key in ("name", "notebook", "grid"):
        if key not in spec:
            raise ValueError(f"{key} is missing from {path}; required: name, notebook, grid")
    name, notebook = spec["name"], spec["notebook"]
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", name):
        raise ValueError(f"name must match [A-Za-z0-9_-]+ (it names files), got {name!r}")
    if not isinstance(notebook, str):
        raise ValueError(f"notebook must be a path (relative to the grid file's folder), got {notebook!r}")
    # Relative to the grid file, so that a grid runs the same from the repo root, from notebooks/ or from anywhere.
    notebook = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), notebook))
    if not os.path.isfile(notebook):
        raise ValueError(f"notebook must be the path of an existing file relative to {os.path.dirname(path) or '.'}; "
                         f"{spec['notebook']!r} gives {notebook}, which does not exist")
    parameters, grid = spec.get("parameters") or {}, spec["grid"]
    if not isinstance(parameters, dict):
        raise ValueError(f"parameters must be a mapping of name: value, got {parameters!r}")
    if not isinstance(grid, dict) or not grid:
        raise ValueError(f"grid must be a non-empty mapping of name: [values], got {grid!r}")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"grid.{key} must be a non-empty list of values, got {values!r}")
        if len({json.dumps(v, sort_keys=True, default=str) for v in values}) < len(values):
            raise ValueError(f"grid.{key} repeats a value; each point must be distinct, got {values!r}")
    both = sorted(set(parameters) & set(grid))
    if both:
        raise ValueError(f"{', '.join(both)} is in both parameters and grid; put each key in one of them")
    check_notebook_parameters(notebook, [*parameters, *grid])
    return Grid(name, notebook, parameters, grid)


def check_notebook_parameters(notebook: str, names: list) -> None:
    """Every swept name must be a parameter of the notebook, and the notebook must take results_csv."""
    allowed = notebook_parameters(notebook)
    if "results_csv" not in allowed:
        raise ValueError(f"notebook {notebook} has no results_csv parameter: its cell tagged 'parameters' must "
                         f"define results_csv = '' and the notebook must write its result frame there")
    for key in names:
        if key in SET_BY_SWEEP:
            raise ValueError(f"{key} is set by the sweep for each point; remove it from the grid file")
        if key not in allowed:
            raise ValueError(f"parameter {key!r} is not in the parameters cell of {notebook}; allowed: "
                             f"{', '.join(k for k in allowed if k != 'results_csv')}")


def notebook_parameters(notebook: str) -> list[str]:
    """The names the notebook's parameters cell assigns: papermill's list, plus those its parser skipped (it drops
    a line such as `t = 0.0  # 0 = greedy`, yet injecting t works)."""
    import papermill  # a second or so to import; only the sweep needs it

    names = list(papermill.inspect_notebook(notebook))
    body = _parameters_cell(notebook)
    targets = [t for node in body if isinstance(node, ast.Assign) for t in node.targets]
    targets += [node.target for node in body if isinstance(node, ast.AnnAssign)]
    return names + list(dict.fromkeys(t.id for t in targets if isinstance(t, ast.Name) and t.id not in names))


def _parameters_cell(notebook: str) -> list[ast.stmt]:
    """The statements of the notebook's cell tagged 'parameters' (none where it has none or it is not plain Python:
    IPython magics, say)."""
    cells = [c for c in nbformat.read(notebook, as_version=4).cells if "parameters" in c.metadata.get("tags", [])]
    try:
        return ast.parse(cells[0].source).body if cells else []
    except SyntaxError:
        return []


def notebook_defaults(notebook: str) -> dict:
    """The values the notebook's parameters cell gives its parameters, where each is a literal: what a point that
    does not set one runs at."""
    values = {}
    for node in _parameters_cell(notebook):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            with contextlib.suppress(ValueError, SyntaxError):
                values[node.targets[0].id] = ast.literal_eval(node.value)
    return values


def check_kernel() -> None:
    """papermill's python3 kernel must run this environment's python, or the notebooks would see other packages."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    python = spec.argv[0]  # jupyter_client swaps a bare "python" or "python3" for sys.executable
    bare = python in ("python", f"python{sys.version_info[0]}", "python{}.{}".format(*sys.version_info[:2]))
    if not bare and os.path.dirname(os.path.abspath(python)) != os.path.dirname(sys.executable):
        raise ValueError(f"the python3 Jupyter kernel ({spec.resource_dir}) runs {python}, not this environment's "
                         f"{sys.executable}; reinstall it from here: {sys.executable} -m ipykernel install --user")


def _slug(value) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        text = str(value).replace("-", "m")  # -1 -> m1: a dash is a separator below and a bad start for a file
    else:
        text = value if isinstance(value, str) else json.dumps(value, default=str)
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-.") or "x"


def point_id(values: dict, parameters: dict) -> str:
    """A readable slug of the grid values, then a hash of every parameter so two points never share an id."""
    digest = hashlib.sha1(json.dumps(parameters, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{'_'.join(_slug(v) for v in values.values())[:80]}_{digest}"


def done_ids(data_csv: str) -> set[str]:
    if not os.path.exists(data_csv):
        return set()
    frame = pd.read_csv(data_csv, dtype=str, keep_default_na=False)
    if "point_id" not in frame.columns:
        raise ValueError(f"{data_csv} has no point_id column, so it is not a sweep's output; move it or rename the grid")
    return set(frame["point_id"])


def _text(value) -> str:
    return "" if value is None else value if isinstance(value, str) else json.dumps(value, default=str)


def with_provenance(rows: pd.DataFrame, notebook: str, point: Point) -> pd.DataFrame:
    """The point's rows with the columns of ``PROVENANCE`` the notebook did not write, after its own: the kind of the
    machine (``ssd.bench.machines.this_machine`` of the point's device), the device's name, this CPU's recorded flags
    (';'-joined), the kit's commit, the date, and each model's precision. A precision is as the notebook resolved it
    where its rows say (`target_dtype`, or a `precision` label "target bfloat16, draft int8"); else as the point asked
    (from its parameters or the notebook's defaults: "auto" where the rows do not say what auto chose)."""
    # torch comes with these: imported once a point is done, never for a dry run
    from ..bench import machines
    from ..models.devices import resolve_device

    asked = notebook_defaults(notebook) | point.parameters
    columns = machines.columns(resolve_device(asked.get("device", "cpu")))
    for i, role in enumerate(("target", "draft"), start=1):
        if "precision" in rows:
            columns[f"{role}_dtype"] = rows["precision"].map(
                lambda label, i=i: m.group(i) if (m := PRECISION_LABEL.fullmatch(str(label))) else "")
        elif f"{role}_dtype" in asked:
            columns[f"{role}_dtype"] = _text(asked[f"{role}_dtype"])
    return rows.assign(**{name: columns[name] for name in PROVENANCE if name in columns and name not in rows})


def append_point(data_csv: str, point: Point, rows: pd.DataFrame) -> None:
    """Add the point's id and parameters to its rows and append them to data_csv in one atomic rename."""
    extra = {"point_id": point.point_id} | {k: _text(v) for k, v in point.parameters.items() if k not in rows}
    rows = pd.concat([pd.DataFrame(extra, index=rows.index), rows.drop(columns="point_id", errors="ignore")], axis=1)
    old = pd.read_csv(data_csv, dtype=str, keep_default_na=False) if os.path.exists(data_csv) else None
    write_csv(pd.concat([old, rows], ignore_index=True), data_csv)


class _Run:
    """One point's files in the runs folder and its papermill subprocess."""

    def __init__(self, grid: Grid, point: Point, run_dir: str, env: dict, figures: bool):
        self.point, self.notebook, stem = point, grid.notebook, os.path.join(run_dir, point.point_id)
        self.csv, self.log = f"{stem}.csv", f"{stem}.log"
        self.running, self.done, self.failed = f"{stem}.running.ipynb", f"{stem}.ipynb", f"{stem}.failed.ipynb"
        for stale in (self.csv, self.failed):  # so a notebook that forgets to write results_csv cannot pass
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
        notebook = os.path.abspath(grid.notebook)
        # YAML, not JSON: PyYAML reads JSON's 1e-05 as a string.
        per_point = {"results_csv": self.csv} | ({"figures_dir": f"{stem}_figures"} if figures else {})
        params = yaml.safe_dump(point.parameters | per_point)
        # sys.executable runs papermill, and papermill runs the python3 kernel with its own sys.executable; the kernel
        # talks over Unix sockets, which a point beside it cannot take (ssd.course.kernel).
        cmd = [sys.executable, "-m", "ssd.execute", notebook, self.running, "--parameters", params]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)

    def finish(self, data_csv: str) -> str | None:
        """Append the point's rows and return None, or return why it failed."""
        try:
            if self.proc.returncode != 0:
                raise RuntimeError(_last_error(self.log))
            if not os.path.exists(self.csv):
                raise RuntimeError(f"the notebook finished but wrote no results_csv ({self.csv})")
            rows = pd.read_csv(self.csv, dtype=str, keep_default_na=False)
            if rows.empty:
                raise RuntimeError("the notebook wrote no rows to results_csv, so the point could not be marked done")
        except (RuntimeError, ValueError) as e:  # ValueError: pandas could not parse results_csv
            with contextlib.suppress(FileNotFoundError):
                os.replace(self.running, self.failed)
            return f"{e} (notebook {self.failed}, log {self.log})"
        os.replace(self.running, self.done)  # before the append, so a point in data_csv always has its notebook
        append_point(data_csv, self.point, with_provenance(rows, self.notebook, self.point))
        os.unlink(self.log)
        return None

    def stop(self) -> None:
        self.proc.terminate()  # papermill's kernel sees its parent go and exits within a second


def _last_error(log: str) -> str:
    with open(log) as f:
        lines = [line.strip() for line in f if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception)\b", line)]
    return (errors or lines or ["papermill failed without output"])[-1]


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """Turn SIGTERM into KeyboardInterrupt, so both run the cleanup that stops the children."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def kernel_threads(jobs: int) -> int:
    """Each of `jobs` kernels' share of the cores, so they share them rather than fight over them: the cores this
    process may use, or fewer where the caller set OMP_NUM_THREADS (a pytest worker's share, a shell's limit)."""
    # As cores.available_cores counts them; that module imports torch, which a sweep's parent never needs.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    limit = os.environ.get("OMP_NUM_THREADS", "")
    if limit.isdigit() and int(limit) > 0:
        cores = min(cores, int(limit))
    return max(1, cores // jobs)


def run_sweep(grid: Grid, jobs: int = 1, data_dir: str = "data", runs_dir: str = "runs",
              dry_run: bool = False) -> list[str]:
    """Run the points not yet in <data_dir>/<name>.csv, `jobs` at a time; return the failed points' ids."""
    check_at_least(jobs, "jobs")
    data_csv = os.path.join(data_dir, f"{grid.name}.csv")
    run_dir = os.path.abspath(os.path.join(runs_dir, grid.name))  # the kernel runs in the notebook's folder
    done, every = done_ids(data_csv), grid.points()
    todo = [p for p in every if p.point_id not in done]
    if dry_run:
        for p in every:
            print(f"{'done' if p.point_id in done else 'todo'}  {p.point_id}  {json.dumps(p.parameters, default=str)}")
        print(f"{len(todo)} of {len(every)} points to run")
        return []
    check_kernel()
    os.makedirs(run_dir, exist_ok=True)
    figures = "figures_dir" in notebook_parameters(grid.notebook)
    threads = str(kernel_threads(jobs))
    env = os.environ | {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    failed, running = [], []
    with tqdm(total=len(todo), unit="point", desc=grid.name, disable=None) as bar, _sigterm_as_interrupt():
        try:
            while todo or running:
                while todo and len(running) < jobs:
                    running.append(_Run(grid, todo.pop(0), run_dir, env, figures))
                for run in [r for r in running if r.proc.poll() is not None]:
                    running.remove(run)
                    error = run.finish(data_csv)
                    if error:
                        failed.append(run.point.point_id)
                        tqdm.write(f"point {run.point.point_id} failed: {error}", file=sys.stderr)
                    bar.update()
                time.sleep(0.05)
        finally:
            for run in running:
                run.stop()
            for run in running:
                try:
                    run.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    run.proc.kill()
    return failed
