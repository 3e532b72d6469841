"""Where the kit's results lie: one folder of data/ per kind of machine, so that one machine's current results sit
together and a reader always knows which machine a number came from.

    data/<machine>/              the current results measured on one kind of machine: bench JSONs, sweep CSVs and
                                 profiles/ (the folder's name is ``kind_slug`` of the kind: 'amd-epyc-avx2')
    data/archive/<machine>/      results a later run superseded, kept: nothing measured is lost
    data/index.csv               one row per file: its machine, precision, commit, date, the command that made it,
                                 and what superseded it

Every result written from now on also carries its own provenance (``provenance``): the machine's folder name, the
commit of the kit that measured it, and the date; the kind itself (model, ISA, flags) is in its environment record.
"""
from __future__ import annotations

import functools
import glob
import json
import os
import pathlib
from datetime import datetime, timezone

from ..files import KIT_ROOT
from ..models.capability import kind_of, kind_slug, machine_kind

DATA = str(KIT_ROOT / "data")
ARCHIVE = "archive"
INDEX = "index.csv"


def this_machine(device="cpu") -> str:
    """The folder name of the machine this process runs on ('amd-epyc-avx512-bf16')."""
    return kind_slug(machine_kind(device))


@functools.cache  # one process measures at one commit
def commit(root=KIT_ROOT) -> str:
    """The kit's commit (the short hash of the checkout's HEAD), or 'unknown' outside a clone. Read from .git's files
    rather than by running git: a bench records it, and the unit tier starts no process."""
    git = pathlib.Path(root) / ".git"
    try:
        if git.is_file():  # a worktree: .git names the folder that holds its HEAD
            git = (git.parent / git.read_text().split("gitdir:", 1)[1].strip()).resolve()
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head[:7]  # a detached HEAD holds the hash itself
        ref = head.split(None, 1)[1]
        common = git / "commondir"
        common = (git / common.read_text().strip()).resolve() if common.is_file() else git
        for folder in (git, common):
            if (folder / ref).is_file():
                return (folder / ref).read_text().strip()[:7]
        for line in (common / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line[:7]
    except (OSError, IndexError):
        pass
    return "unknown"


def provenance(device="cpu") -> dict:
    """What every stored result records beside its environment: the machine's folder, the commit, the date."""
    return {"machine": this_machine(device), "commit": commit(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def stored_machines(root: str = DATA) -> list[str]:
    """The machines with current results under `root`, by folder name."""
    if not os.path.isdir(root):
        return []
    return sorted(name for name in os.listdir(root)
                  if name != ARCHIVE and not name.startswith(".") and os.path.isdir(os.path.join(root, name))
                  and kind_in(root, name) is not None)


def kind_in(root: str, machine: str) -> dict | None:
    """The kind of machine (``ssd.models.capability.machine_kind``) that a folder's results recorded, read from the
    first bench JSON or profile in it that names one; None where none does."""
    folder = os.path.join(root, machine)
    paths = glob.glob(os.path.join(folder, "*.json")) + glob.glob(os.path.join(folder, "profiles", "*.json"))
    for path in sorted(paths):
        try:
            with open(path) as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict):
            continue
        if "environment" in record and record["environment"].get("capability"):
            return kind_of(record["environment"])
        if "capability" in record and "target_ms" in record:  # a profile: its device is the CPU
            return kind_of({"device": "cpu", "capability": record["capability"]})
        if "gpu" in record and "device" in record:  # make gpu-check's record
            return {"device": record["device"].split(":")[0], "device_name": record["gpu"], "isa": None, "flags": []}
    return None


def similarity(a: dict, b: dict) -> tuple:
    """How near two kinds of machine are, for choosing which stored results stand in for this one: the same device
    type first, then the same native bfloat16 and AMX (which set what a verify pass costs), the same vendor, and the
    share of recorded flags in common."""
    flags_a, flags_b = set(a.get("flags") or []), set(b.get("flags") or [])
    same = [a.get("device") == b.get("device"),
            ("avx512_bf16" in flags_a or "amx_bf16" in flags_a) == ("avx512_bf16" in flags_b or "amx_bf16" in flags_b),
            ("amx_bf16" in flags_a) == ("amx_bf16" in flags_b),
            kind_slug(a).split("-")[0] == kind_slug(b).split("-")[0]]
    shared = len(flags_a & flags_b) / max(1, len(flags_a | flags_b))
    return (*same, shared)


def nearest(kind: dict, root: str = DATA, having: str | None = None) -> str | None:
    """The stored machine whose kind is nearest `kind` (itself where stored), among those whose folder holds the
    file `having` where one is named; None where no folder qualifies."""
    candidates = [m for m in stored_machines(root) if having is None or os.path.exists(os.path.join(root, m, having))]
    return _nearest_of(candidates, kind, root) if candidates else None


def _nearest_of(candidates: list[str], kind: dict, root: str) -> str:
    """Of stored machines, the one whose kind is nearest `kind`: itself, then the most alike (``similarity``)."""
    exact = kind_slug(kind)
    return max(candidates, key=lambda m: (m == exact, similarity(kind, kind_in(root, m))))


def chosen(root: str, kind: dict, machine: str, keeping: list[str], what: str) -> str:
    """The machine whose stored `what` a notebook shows: `machine` where it is one of `keeping` (the folders under
    `root` that hold it), or with 'nearest' the one of them nearest `kind` (itself first); else a one-line error
    naming what is kept where."""
    if machine != "nearest":
        if machine not in keeping:
            raise ValueError(f"machine must be 'nearest' or a folder of {root} that keeps {what} "
                             f"({', '.join(keeping) or 'none does'}); got {machine!r}")
        return machine
    if not keeping:
        raise ValueError(f"no machine under {root} keeps {what}")
    return _nearest_of(keeping, kind, root)


def describe(root: str, machine: str) -> str:
    """One line naming a stored machine for a caption: 'AMD EPYC, AVX512 (avx2, avx512_bf16, ...)'."""
    from ..models.capability import kind_line

    kind = kind_in(root, machine)
    return kind_line(kind) if kind else machine


def columns(device="cpu") -> dict:
    """What a stored table's rows record of what measured them: the machine's folder, the device's name, the CPU's
    recorded flags (';'-joined), the kit's commit and the date (``provenance``)."""
    from ..models.capability import cpu_flags, device_name

    record = provenance(device)
    return {"machine": record["machine"], "device_name": device_name(device), "flags": ";".join(cpu_flags()),
            "commit": record["commit"], "date": record["date"]}


def stamp(frame, pair):
    """A table's rows with what measured them (``columns``, and each model's precision), where they do not say it
    already: a CSV stands alone."""
    found = columns(pair.target.device) | {"target_dtype": pair.precisions.target, "draft_dtype": pair.precisions.draft}
    return frame.assign(**{name: value for name, value in found.items() if name not in frame})
