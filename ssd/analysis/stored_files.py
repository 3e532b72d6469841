"""Where the numbers a notebook shows from data/ came from: for a stored table, the machine that measured it (its
folder of data/, in words) and the precisions, read from data/index.csv, as the kit's one record of a stored file
(``ssd.analysis.sources.Source``): its str is the line for the notebook to print above the table, its ``line`` the
caption under its figure (``style.caption``). A table is only as good as the machine it names, and the findings of
notebook 06 come from several.

The precision is read from the index, else from the table's own target_dtype/draft_dtype columns, else from what the
caller says (a file stored before the kit recorded precisions); where two of those disagree, or none says, this fails
rather than caption a figure with a guess.
"""
from __future__ import annotations

import glob
import os

import pandas as pd

from ..bench import machines
from ..bench.profile import load as load_profile
from ..names import PRECISIONS
from .sources import TABLE, Source


def _entry(data_dir: str, path: str) -> pd.Series:
    index = os.path.join(data_dir, machines.INDEX)
    if not os.path.isfile(index):
        raise ValueError(f"data_dir must hold {machines.INDEX} (the list of stored files); {index} does not exist")
    rows = pd.read_csv(index, dtype=str, keep_default_na=False)
    found = rows[rows["path"] == path]
    if len(found) != 1:
        raise ValueError(f"path must be a file {index} lists once; {path!r} is listed {len(found)} times")
    return found.iloc[0]


def _check_precision(pair: tuple, said: str) -> tuple[str, str]:
    if len(pair) != 2 or not all(p in PRECISIONS for p in pair):
        raise ValueError(f"{said} must be 'TARGET/DRAFT' with each one of {sorted(PRECISIONS)}; got {'/'.join(pair)!r}")
    return tuple(pair)


def _precisions(path: str, entry: pd.Series, frame: pd.DataFrame | None, precision: str | None) -> tuple[str, str]:
    """Each source that says something about the file's precisions: the index, its columns, the caller; all must
    agree and one must speak."""
    said = {}
    if entry["precision"]:
        said["data/index.csv"] = _check_precision(tuple(entry["precision"].split("/")), "the index's precision")
    if frame is not None and {"target_dtype", "draft_dtype"} <= set(frame.columns):
        columns = frame[["target_dtype", "draft_dtype"]].drop_duplicates()
        if len(columns) != 1:
            raise ValueError(f"{path} holds {len(columns)} pairs of precisions; one source line names one")
        said["the table"] = tuple(columns.iloc[0])
    if precision:
        said["precision"] = _check_precision(tuple(precision.split("/")), "precision")
    if not said:
        raise ValueError(f"{path} records no precision (neither data/index.csv nor its columns): pass "
                         "precision='TARGET/DRAFT'")
    if len(set(said.values())) > 1:
        raise ValueError(f"{path}: the precisions disagree: "
                         + "; ".join(f"{where} says {'/'.join(p)}" for where, p in said.items()))
    return next(iter(said.values()))


def stored(data_dir: str, path: str, frame: pd.DataFrame | None = None, precision: str | None = None) -> Source:
    """Where the file `path` (inside `data_dir`, as data/index.csv lists it) was measured. frame: its table, whose
    precision columns (if any) are checked against the index; precision: 'TARGET/DRAFT', for a file that records
    none."""
    entry = _entry(data_dir, path)
    machine = entry["machine"]
    if frame is not None and "machine" in frame.columns and set(frame["machine"].dropna()) - {machine}:
        raise ValueError(f"{path}: its rows name machines {sorted(set(frame['machine']))}, the index {machine!r}")
    precisions = _precisions(path, entry, frame, precision)
    return Source(path.split("/", 1)[1], TABLE, frame if frame is not None else pd.DataFrame(), precisions,
                  date=entry["date"], commit=entry["commit"], machine=machine,
                  words=machines.describe(data_dir, machine))


def stored_csv(data_dir: str, path: str, precision: str | None = None) -> tuple[pd.DataFrame, Source]:
    """A stored sweep table and where it was measured (``stored``)."""
    _entry(data_dir, path)  # listed, before reading it
    frame = pd.read_csv(os.path.join(data_dir, path))
    return frame, stored(data_dir, path, frame, precision)


def stored_profiles(data_dir: str, machine: str) -> dict:
    """The latency profiles at b = 1 kept in data/<machine>/profiles/, by their precisions' label ('target float32,
    draft float32'), float32 first: what a pass cost on that machine (``ssd.bench.profile.regime``)."""
    paths = sorted(glob.glob(os.path.join(data_dir, machine, "profiles", "*.json")))
    profiles = [p for p in map(load_profile, paths) if p.batch_size == 1]
    if not profiles:
        raise ValueError(f"machine must name a folder of {data_dir} with profiles at b = 1; {machine!r} has none")
    profiles.sort(key=lambda p: (p.precisions["target"] != "float32", p.precisions["target"], p.precisions["draft"]))
    return {f"target {p.precisions['target']}, draft {p.precisions['draft']}": p for p in profiles}
