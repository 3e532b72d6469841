"""The whole course at its defaults: `python -m ssd course` executes every numbered notebook with papermill, in
order, into executed copies.

Two kinds of run, told apart by where the copies go:
- a user's run (`make run`: `--out runs/course`): every file a notebook writes goes under the out folder, and the
  tracked files stay as they are. Each notebook is given the output parameters of ``OUTPUTS`` it declares in its
  parameters cell: its figures to OUT/figures, what it measured (bench JSONs) to OUT/results/<machine> (the folder
  `python -m ssd report --from` renders as this machine's page), notebook 06's live sweep to OUT/demo. The notebooks
  still read the kit's stored results from ../data.
- the maintainers' stored run (`make figures`: `--out notebooks`, the notebooks' own folder): the notebooks rewritten
  in place at their defaults, with no parameter injected, so the figures go to figures/ and the stored notebooks
  show what the committed figures show.

Each executed notebook is written under a temporary name and renamed when it finishes, so the output folder never
holds a half-run notebook under a finished one's name; a failing notebook is kept as NAME.failed.ipynb.
"""
from __future__ import annotations

import glob
import os
import sys
import time

from tqdm.auto import tqdm

NOTEBOOK_PATTERN = "[0-9][0-9]_*.ipynb"
# A user's run: each output parameter a notebook declares, and where under the out folder it points ({machine}: this
# kind of machine's folder name, ssd.bench.machines.this_machine)
OUTPUTS = {"figures_dir": "figures", "results_dir": os.path.join("results", "{machine}"), "demo_dir": "demo"}


def course_notebooks(notebooks_dir: str = "notebooks") -> list[str]:
    """The course's notebooks, in order: NN_name.ipynb, not a failed or running copy a run left beside them (written
    into the course's own folder, ``--out notebooks``, it would else run as a notebook of its own next time)."""
    paths = sorted(p for p in glob.glob(os.path.join(notebooks_dir, NOTEBOOK_PATTERN))
                   if not p.endswith((".failed.ipynb", ".running.ipynb")))
    if not paths:
        raise ValueError(f"notebooks_dir {notebooks_dir!r} holds no notebook named like {NOTEBOOK_PATTERN}")
    return paths


def in_place(notebooks_dir: str, out_dir: str) -> bool:
    """Whether the copies go over the notebooks themselves: the maintainers' stored run."""
    return os.path.realpath(notebooks_dir) == os.path.realpath(out_dir)


def outputs(out_dir: str, machine: str) -> dict:
    """Every output parameter of a user's run, as an absolute path under `out_dir` (the kernel runs in notebooks/)."""
    out = os.path.abspath(out_dir)
    return {name: os.path.join(out, folder.format(machine=machine)) for name, folder in OUTPUTS.items()}


def results_dir(out_dir: str, machine: str) -> str:
    """Where a user's run keeps what the notebooks measured: the folder `python -m ssd report --from` reads."""
    return outputs(out_dir, machine)["results_dir"]


def course_parameters(notebook: str, given: dict) -> dict:
    """Those of `given` that the notebook declares in its parameters cell: papermill warns of any other, and a
    notebook without figures_dir, say, writes no figure."""
    from .sweep import notebook_parameters  # papermill and nbformat: only a run of the course needs them

    declared = set(notebook_parameters(notebook))
    return {name: value for name, value in given.items() if name in declared}


def run_course(notebooks_dir: str = "notebooks", out_dir: str = "runs/course", only: list[str] | None = None,
               parameters: dict | None = None) -> dict:
    """Execute the notebooks (those whose names start with one of `only`, if given); returns seconds per notebook.
    A user's run gives each notebook the output parameters it declares (``outputs``), and those of `parameters` it
    declares (pair_name="tiny", say); the stored run (out_dir is notebooks_dir) gives none. Stops at the first
    failure, raising papermill's error with the path of the failed copy."""
    from ..bench.machines import this_machine
    from .kernel import execute_notebook
    from .sweep import check_kernel

    paths = [p for p in course_notebooks(notebooks_dir) if not only or os.path.basename(p).startswith(tuple(only))]
    if not paths:
        raise ValueError(f"only={only!r} matches none of the notebooks in {notebooks_dir}")
    stored_run = in_place(notebooks_dir, out_dir)
    if stored_run and parameters:
        raise ValueError(f"parameters {sorted(parameters)} cannot be given to the stored run (out_dir is the "
                         f"notebooks' own folder {notebooks_dir}): the stored notebooks run at their defaults")
    check_kernel()
    given = {} if stored_run else outputs(out_dir, this_machine()) | (parameters or {})
    os.makedirs(out_dir, exist_ok=True)
    seconds = {}
    for path in tqdm(paths, desc="course", unit="notebook"):
        name = os.path.basename(path)
        out = os.path.join(os.path.abspath(out_dir), name)
        running, failed = out.replace(".ipynb", ".running.ipynb"), out.replace(".ipynb", ".failed.ipynb")
        start = time.perf_counter()
        try:  # in the notebook's folder, as in JupyterLab and nbval
            execute_notebook(path, running, course_parameters(path, given))
        except BaseException:
            if os.path.exists(running):
                os.replace(running, failed)
            raise
        os.replace(running, out)
        seconds[name] = time.perf_counter() - start
        tqdm.write(f"{name}: {seconds[name]:.0f} s -> {out}")
    return seconds


def report_command(out_dir: str, page: str, machine: str) -> list[str]:
    """The command that renders a user's run as this machine's page: `python -m ssd report --from
    OUT/results/<machine> --out PAGE` (the page beside the nearest stored machine's; ssd.analysis.report)."""
    return [sys.executable, "-m", "ssd", "report", "--from", results_dir(out_dir, machine), "--out", page]
