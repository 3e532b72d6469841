"""Files: atomic writes (a reader never sees a half-written file, and an interrupted run leaves the old one in
place), the user cache folder where weights, precision decisions and latency profiles are kept, and where the kit's
own files are."""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import tempfile

import pandas as pd

# The checkout the package runs from (its data/, tests/); in an installed wheel, site-packages, which has neither
KIT_ROOT = pathlib.Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def atomic_path(path: str):
    """Yield a temporary path beside `path`; rename it onto `path` only if the block finishes."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.splitext(path)[1], dir=directory)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; the result is an ordinary file
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def cache_lock(name: str, wait: bool = True):
    """Hold the exclusive lock `name` (a file in the cache's locks/ folder) for the block: one process builds a cache
    entry (weights, a precision decision) while others wait for it and then read it, rather than all building it at
    once (a second build of the weights would double the memory; a second timing would run beside the first and
    skew both). Yields True once held; with wait=False, False at once where another process holds it."""
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks; the atomic rename still keeps every entry whole
        yield True
        return
    folder = cache_dir() / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{name}.lock", "a") as f:
        try:  # released when the file closes, and by the OS if this process dies
            fcntl.flock(f, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: str, result: dict) -> None:
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(result, f, indent=2, default=str)


def write_csv(frame: pd.DataFrame, path: str) -> None:
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)


def cache_dir() -> pathlib.Path:
    """$SSD_CACHE_DIR if set, else $XDG_CACHE_HOME/ssd, else ~/.cache/ssd."""
    if os.environ.get("SSD_CACHE_DIR"):
        return pathlib.Path(os.environ["SSD_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base).expanduser() / "ssd"
