"""Where the numbers a notebook shows from data/ came from: for a stored table, the machine that measured it (its
folder of data/, in words) and the precisions, read from data/index.csv, as the kit's one record of a stored file
(``ssd.analysis.sources.Source``): its str is the line for the notebook to print above the table, its ``line`` the
caption under its figure (``style.caption``). A table is only as good as the machine it names, and the findings of
notebook 06 come from several.

The precision is read from the index, else from the table's own target_dtype/draft_dtype columns, else from what the
caller says (a file stored before the kit recorded precisions); where two of those disagree, or none says, this fails
rather than caption a figure with a guess.

A stored bench a notebook shows (``stored_bench``, ``stored_or_run``) is read by the report's own reader
(``sources.bench_source``) and answers only for the pair, precisions and forward it ran (``other_precisions``: this
pair at others, said so), from this kind of machine's folder or the nearest stored one's (``machine_to_show``), with
the profile of the machine that measured it (``profile_of``).
"""
from __future__ import annotations

import glob
import json
import os

import pandas as pd

from ..bench import machines
from ..bench.profile import load as load_profile
from ..bench.run import run_bench
from ..core.decoding import DecodeConfig
from ..core.latencies import Profile
from ..core.tuning import Autotune
from ..models.capability import kind_line, kind_of, machine_kind
from ..models.cores import check_cores
from ..names import PRECISIONS
from .sources import TABLE, Source, bench_forward, bench_source


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
    draft float32'; ', compiled forwards' after a compiled one's), float32 first: what a pass cost on that machine
    (``ssd.bench.profile.regime``)."""
    paths = sorted(glob.glob(os.path.join(data_dir, machine, "profiles", "*.json")))
    profiles = [p for p in map(load_profile, paths) if p.batch_size == 1]
    if not profiles:
        raise ValueError(f"machine must name a folder of {data_dir} with profiles at b = 1; {machine!r} has none")
    profiles.sort(key=lambda p: (p.precisions["target"] != "float32", p.precisions["target"], p.precisions["draft"],
                                 p.forward != "eager"))
    return {f"target {p.precisions['target']}, draft {p.precisions['draft']}"
            + (f", {p.forward} forwards" if p.forward != "eager" else ""): p for p in profiles}


def stored_bench(path: str, pair, *, other_precisions: bool = False) -> dict | None:
    """The bench result stored at `path` (``python -m ssd bench --json PATH``) if it exists and was measured on this
    pair at these precisions (each model's) and forward, with "source": the file as a ``Source`` (its machine, date,
    commit, settings), and "elsewhere": None where it was measured on this kind of machine
    (``ssd.models.capability.machine_kind``), else one line saying where; otherwise None. Timings and the auto rule's
    reason do not count: they never repeat, even on the machine that stored the result.
    other_precisions: a bench of this pair at other precisions or forwards counts too (a notebook shows another
    machine's bench where this one has none), its "elsewhere" line naming what it ran at."""
    if not (path and os.path.exists(path)):
        return None
    with open(path) as f:
        result = json.load(f)
    source = bench_source(path, result)
    same_precisions = source.precision == (pair.precisions.target, pair.precisions.draft)
    if source.settings["pair"] != pair.name or not (
            (same_precisions and source.forward == pair.forward) or other_precisions):
        return None
    there, here = kind_of(result.get("environment", {})), machine_kind(pair.target.device)
    notes = [] if there == here else [f"on another kind of machine ({kind_line(there)}; this one: {kind_line(here)})"]
    if not same_precisions:
        notes.append(f"at target {source.target}, draft {source.draft} (this pair here: {pair.precisions.label})")
    if source.forward != pair.forward:
        notes.append(f"with {source.forward} forwards (this pair here: {pair.forward})")
    elsewhere = f"measured {' and '.join(notes)}: shown as stored, not re-measured" if notes else None
    return result | {"source": source, "elsewhere": elsewhere}


def stored_or_run(path: str, pair, prompts, methods: list[str], config: DecodeConfig, *, measure_missing: bool,
                  progress: bool = True, autotune: Autotune | None = None,
                  other_precisions: bool = False) -> dict | None:
    """The bench result stored at `path` if it was measured on this pair at these precisions (``stored_bench``);
    otherwise, with measure_missing, the same methods run here on `prompts` (not written; the methods on auto with the
    autotune), and without it None: a notebook at its defaults never re-measures a long bench, it shows the stored
    one or says how to measure it. A result carries "source": the stored file's ``Source``, or None where it was
    measured here."""
    found = stored_bench(path, pair, other_precisions=other_precisions)
    if found is not None or not measure_missing:
        return found
    result = run_bench(pair, prompts, methods, config, progress=progress, autotune=autotune)
    return result | {"source": None, "elsewhere": None, "precision": pair.precisions.as_dict(),
                     "forward": pair.forward}


def not_stored_line(path: str, pair) -> str:
    """Why ``stored_bench`` found nothing at `path` for this pair, in one line."""
    if not (path and os.path.exists(path)):
        return f"{path}: not measured yet"
    source = bench_source(path)
    return (f"{path}: measured on {source.settings['pair']} at target {source.target}, draft {source.draft}, "
            f"{source.forward} forwards, not on {pair.name} at {pair.precisions.label}, {pair.forward} forwards")


def machine_to_show(root: str, machine: str, device="cpu", having: str | None = None) -> str | None:
    """The folder of `root` (data/<machine>) whose stored benches a notebook shows: `machine` "nearest", this kind of
    machine's own where its folder holds the file `having`, else the nearest kind whose folder does
    (``machines.nearest``; None where none does); "here", this machine's folder, whether it holds them or not; or a
    stored machine's folder by name."""
    if machine == "nearest":
        return machines.nearest(machine_kind(device), root, having=having)
    if machine == "here":
        return machines.this_machine(device)
    names = machines.stored_machines(root)
    if machine not in names:
        raise ValueError(f"machine must be 'nearest', 'here' or a stored machine of {root} ({', '.join(names)}); "
                         f"got {machine!r}")
    return machine


def profile_of(result: dict, folder: str) -> Profile | None:
    """The profile kept in `folder` (data/<machine>, its profiles/) for what a stored bench `result` ran: its pair, its
    precisions and forward, its ranks' cores, at b = 1, on its kind of machine. A prediction drawn beside that bench
    is priced on it, so that predicted and measured are of one machine; None where the folder keeps none."""
    args, precision = result.get("args", {}), result.get("precision") or {}
    kind = kind_of(result.get("environment", {}))
    for path in sorted(glob.glob(os.path.join(folder, "profiles", "*.json"))):
        try:
            profile = load_profile(path)
        except (ValueError, TypeError, KeyError):
            continue  # not a profile
        if (profile.pair == args.get("pair") and profile.batch_size == 1
                and profile.forward == bench_forward(result)
                and (profile.precisions.get("target"), profile.precisions.get("draft"))
                == (precision.get("target"), precision.get("draft"))
                and profile.verifier_cores == check_cores(args.get("verifier_cores", "0"), "verifier_cores")
                and profile.drafter_cores == check_cores(args.get("drafter_cores", "1"), "drafter_cores")
                and kind_of({"device": "cpu", "capability": profile.capability}) == kind):
            return profile
    return None
