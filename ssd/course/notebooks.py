"""The whole course at its defaults: `python -m ssd course` executes every numbered notebook with papermill, in
order, into executed copies (the notebooks themselves write data/ and figures/).

Each executed notebook is written under a temporary name and renamed when it finishes, so the output folder never
holds a half-run notebook under a finished one's name; a failing notebook is kept as NAME.failed.ipynb.
"""
from __future__ import annotations

import glob
import os
import time

from tqdm.auto import tqdm

NOTEBOOK_PATTERN = "[0-9][0-9]_*.ipynb"


def course_notebooks(notebooks_dir: str = "notebooks") -> list[str]:
    paths = sorted(glob.glob(os.path.join(notebooks_dir, NOTEBOOK_PATTERN)))
    if not paths:
        raise ValueError(f"notebooks_dir {notebooks_dir!r} holds no notebook named like {NOTEBOOK_PATTERN}")
    return paths


def run_course(notebooks_dir: str = "notebooks", out_dir: str = "runs/course", only: list[str] | None = None) -> dict:
    """Execute the notebooks (those whose names start with one of `only`, if given); returns seconds per notebook.
    Stops at the first failure, raising papermill's error with the path of the failed copy."""
    from .kernel import execute_notebook
    from .sweep import check_kernel

    check_kernel()
    paths = [p for p in course_notebooks(notebooks_dir) if not only or os.path.basename(p).startswith(tuple(only))]
    if not paths:
        raise ValueError(f"only={only!r} matches none of the notebooks in {notebooks_dir}")
    os.makedirs(out_dir, exist_ok=True)
    seconds = {}
    for path in tqdm(paths, desc="course", unit="notebook"):
        name = os.path.basename(path)
        out = os.path.join(os.path.abspath(out_dir), name)
        running, failed = out.replace(".ipynb", ".running.ipynb"), out.replace(".ipynb", ".failed.ipynb")
        start = time.perf_counter()
        try:
            execute_notebook(path, running)  # in the notebook's folder, as in JupyterLab and nbval
        except BaseException:
            if os.path.exists(running):
                os.replace(running, failed)
            raise
        os.replace(running, out)
        seconds[name] = time.perf_counter() - start
        tqdm.write(f"{name}: {seconds[name]:.0f} s -> {out}")
    return seconds
