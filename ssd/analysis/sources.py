"""Stored results, read into one record, ``Source``: the file, its machine, the precision, the forward, the settings,
the date and commit it was measured at, and its rows. The report (``ssd.analysis.report``) reads a machine's folder
here: every file that holds per-prompt rows (a bench JSON, the benches inside a ``make gpu-check`` record, a sweep CSV
with a row per method and prompt), per-call tables of the batch-size study, and hit-rate sweeps. A notebook reads one
named table, its machine and precisions checked against data/index.csv (``ssd.analysis.stored_files``), as a Source
too, whose ``line`` captions its figure.

A file that does not record its precision (an early sweep CSV) is not read: a figure is only as good as the precision
it names. Nothing here chooses between files; ``ssd.analysis.report`` does, by rules kept in one place.
"""
from __future__ import annotations

import csv
import glob
import json
import os
from dataclasses import dataclass, field, replace

import pandas as pd

from ..bench.machines import INDEX
from ..checks import parse_variant
from .batch_study import point_table
from .style import setting_line

BENCH, CALLS, HIT_RATES, TABLE = "bench", "calls", "hit_rates", "table"  # TABLE: any table a notebook reads
PROMPT_SETS = {"HumanEval/": "humaneval", "prose/": "prose"}  # a prompt id's prefix -> its set
UNKNOWN = "unknown"


@dataclass
class Source:
    """One table of results: `name` (the file, '#precision' for a gpu-check record's bench), `kind` (BENCH: one row
    per method and prompt, with a `run` column that pairs rows run side by side; CALLS: ``batch_study.point_table``'s
    rows; HIT_RATES: a hit-rate sweep's rows; TABLE: a stored table as a notebook reads it), the precision (target,
    draft), whether auto picked it, the forward, the settings, when and at which commit, and on which machine."""
    name: str
    kind: str
    frame: pd.DataFrame
    precision: tuple[str, str]
    auto: bool = False
    settings: dict = field(default_factory=dict)  # pair, k, temperature, max_new_tokens, budget, fan_out, device
    date: str = UNKNOWN
    commit: str = UNKNOWN
    forward: str = "eager"  # how the kit's models ran (ssd.models.forwards); "eager" for files stored before
    machine: str = UNKNOWN  # its folder of data/
    words: str = ""  # the machine in words (``ssd.bench.machines.describe``), where it was looked up

    @property
    def path(self) -> str:
        """Inside data/: 'amd-epyc-avx2/hit_rates.csv'."""
        return f"{self.machine}/{self.name}"

    @property
    def target(self) -> str:
        return self.precision[0]

    @property
    def draft(self) -> str:
        return self.precision[1]

    @property
    def line(self) -> str:
        """The caption under a figure drawn from this file (``style.caption``)."""
        return setting_line(self.words or self.machine, self.target, self.draft)

    def __str__(self) -> str:
        return (f"{self.path}: measured on {self.words or self.machine} (data/{self.machine}/) on {self.date}, target "
                f"{self.target}, draft {self.draft}; stored at commit {self.commit}")


def prompt_set(prompt_id) -> str:
    """'humaneval' or 'prose' from a prompt id ('HumanEval/3', 'prose/0'), else 'other'."""
    return next((name for prefix, name in PROMPT_SETS.items() if str(prompt_id).startswith(prefix)), "other")


def plain(method: str) -> str | None:
    """The name a figure knows a method by: the method itself, or with its backup ('ssd-pipeline:jit'); None for a
    variant that sets K, B or anything else (sd:k=2 is not SD at the bench's K). The batch size stays in its column."""
    base, overrides = parse_variant(method)
    overrides.pop("batch_size", None)
    if not overrides:
        return base
    return f"{base}:{overrides['backup']}" if set(overrides) == {"backup"} else None


def read_folder(folder: str) -> list[Source]:
    """Every source in `folder`, sorted by name (the report's output must not depend on the order of the disk)."""
    if not os.path.isdir(folder):
        raise ValueError(f"folder must be a folder of one machine's results, got {folder!r} (no such folder)")
    index = _index(folder)
    sources = []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        sources += _from_json(path, index)
    for path in sorted(glob.glob(os.path.join(folder, "*.csv"))):
        sources += _from_csv(path, index)
    machine = os.path.basename(os.path.abspath(folder))
    return sorted((replace(s, machine=machine) for s in sources), key=lambda s: s.name)


def _index(folder: str) -> dict[str, dict]:
    """data/index.csv's rows by file name, where the folder is one of data/'s (its date and commit come from there:
    files stored before benches recorded their commit)."""
    path = os.path.join(os.path.dirname(os.path.abspath(folder)), INDEX)
    if not os.path.exists(path):
        return {}
    machine = os.path.basename(os.path.abspath(folder))
    with open(path, newline="") as f:
        return {row["path"].split("/", 1)[1]: row for row in csv.DictReader(f) if row["path"].startswith(machine + "/")}


def _stamp(name: str, index: dict, environment: dict) -> tuple[str, str]:
    row = index.get(name, {})
    date = row.get("date") or str(environment.get("date") or UNKNOWN)[:10]
    return date, row.get("commit") or environment.get("commit") or UNKNOWN


def _from_json(path: str, index: dict) -> list[Source]:
    name = os.path.basename(path)
    try:
        with open(path) as f:
            record = json.load(f)
    except ValueError:
        return []
    if not isinstance(record, dict):
        return []
    if "rows" in record and "args" in record:
        return _from_bench(name, record, index)
    if "benches" in record and "gpu" in record:  # make gpu-check: a bench per precision inside
        return [s for precision, bench in sorted(record["benches"].items()) if isinstance(bench, dict)
                and "result" in bench for s in _from_bench(f"{name}#{precision}", bench["result"], index, name)]
    return []


def bench_source(path: str, result: dict | None = None) -> Source:
    """One bench JSON (``python -m ssd bench --json``, a notebook's kept bench) as the report reads it from a folder:
    its machine the folder it lies in, its date and commit from data/index.csv where that lists it, else from its own
    environment. result: the file's JSON where the caller has read it already."""
    if result is None:
        with open(path) as f:
            result = json.load(f)
    folder = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    rows = pd.DataFrame(result.get("rows") or [])
    frame = _bench_rows(rows, name) if "prompt_id" in rows else rows
    return Source(name, BENCH, frame, **_bench_record(result, _index(folder), name),
                  machine=os.path.basename(folder))


def _bench_record(result: dict, index: dict, name: str) -> dict:
    """What a bench's JSON says of itself, as Source's fields: its precisions, settings, date, commit, forward."""
    precision = result.get("precision") or {}
    args, environment = result.get("args", {}), result.get("environment", {})
    date, commit = _stamp(name, index, environment)
    settings = {key: args.get(key) for key in ("pair", "k", "temperature", "max_new_tokens", "budget", "fan_out")}
    settings |= {"device": environment.get("device_name") or environment.get("device"),
                 "cores": (environment.get("capability") or {}).get("cores")}
    return dict(precision=(precision.get("target"), precision.get("draft")), settings=settings, date=date,
                commit=commit, auto=str(precision.get("reason", "")).startswith("auto"), forward=bench_forward(result))


def bench_forward(result: dict) -> str:
    """How a bench's JSON says the kit's models ran: eager or compiled (a bench stored before forwards were recorded
    ran eager)."""
    return result.get("forward") or result.get("args", {}).get("forward") or "eager"


def _from_bench(name: str, result: dict, index: dict, indexed: str | None = None) -> list[Source]:
    rows = pd.DataFrame(result["rows"])
    if rows.empty or "prompt_id" not in rows:
        return []
    common = _bench_record(result, index, indexed or name)
    out = [Source(name, BENCH, _bench_rows(rows, name), **common)]
    if rows.get("batch_size", pd.Series([1])).fillna(1).nunique() > 1 and "call" in rows:
        sets = rows["prompt_id"].map(prompt_set).unique()
        if len(sets) == 1:  # the batch study reads one prompt set a table
            out.append(Source(name, CALLS, point_table(result, sets[0]), **common))
    return out


def _bench_rows(rows: pd.DataFrame, run: str) -> pd.DataFrame:
    rows = rows.assign(run=run, label=rows["method"].map(plain), prompts=rows["prompt_id"].map(prompt_set))
    if "batch_size" not in rows:
        rows["batch_size"] = 1
    return rows.assign(batch_size=rows["batch_size"].fillna(1).astype(int))


def _from_csv(path: str, index: dict) -> list[Source]:
    name = os.path.basename(path)
    frame = pd.read_csv(path)
    date, commit = _stamp(name, index, {})
    if {"call", "label", "batch_size", "precision"} <= set(frame.columns):  # the batch-size study's sweep
        return [Source(name, CALLS, frame.assign(prompts=frame["prompts"].str.split(r"[:\[]").str[0]),
                       _precision_words(p), settings=_sweep_settings(frame), date=date, commit=commit)
                for p, frame in frame.groupby("precision", sort=True)]
    if {"strategy", "budget", "hit_rate", "prompt_id"} <= set(frame.columns):  # a hit-rate sweep: no precision
        return [Source(name, HIT_RATES, frame.assign(prompts=frame["prompt_id"].map(prompt_set), run=name),
                       (UNKNOWN, UNKNOWN), settings=_sweep_settings(frame), date=date, commit=commit)]
    if {"method", "prompt_id", "tokens_per_s", "target_dtype", "draft_dtype"} <= set(frame.columns):
        run = frame["point_id"] if "point_id" in frame else name  # a sweep point ran its methods side by side
        rows = _bench_rows(frame.assign(run=run), name).assign(run=run)
        return [Source(name, BENCH, g, (t, d), settings=_sweep_settings(g), date=date, commit=commit)
                for (t, d), g in rows.groupby(["target_dtype", "draft_dtype"], sort=True)]
    return []


def _precision_words(words: str) -> tuple[str, str]:
    """('float32', 'int8') from the batch sweep's 'target float32, draft int8'."""
    parts = dict(part.strip().split(" ", 1) for part in words.split(","))
    return parts.get("target", UNKNOWN), parts.get("draft", UNKNOWN)


def _sweep_settings(frame: pd.DataFrame) -> dict:
    """A sweep's settings where its columns record them (one value each), else None."""
    def one(column):
        values = frame[column].dropna().unique() if column in frame else []
        return values[0].item() if len(values) == 1 and hasattr(values[0], "item") else (
            values[0] if len(values) == 1 else None)

    return {"pair": one("pair"), "k": one("k"), "temperature": one("temperature"),
            "max_new_tokens": one("max_new_tokens"), "budget": one("budget"), "fan_out": None, "device": None,
            "cores": None}
