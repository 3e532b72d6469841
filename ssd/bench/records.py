"""A bench result kept on disk: the environment it records (the machine, torch, the CPU's capability, the float32
library), reading its rows back, and whether a stored result was measured on this pair, at these precisions, on this
kind of machine: a notebook shows a stored bench rather than re-measure it (``stored_or_run``), this kind of
machine's or the nearest stored one's (``machine_to_show``), with the profile of the machine that measured it
(``profile_of``)."""
from __future__ import annotations

import glob
import json
import os
import platform
from datetime import datetime, timezone

import pandas as pd
import torch

from ..models import kernels
from ..core.decoding import DecodeConfig
from ..models.capability import capability, device_name, kind_line, kind_of, kind_slug, machine_kind
from ..core.latencies import Profile
from ..models.cores import check_cores
from .machines import commit, nearest, stored_machines, this_machine
from .profile import load as load_profile
from ..core.tuning import Autotune
from .run import run_bench


def load_rows(path: str) -> pd.DataFrame:
    """The per-(method, prompt) rows of a bench result written by `python -m ssd bench --json PATH`."""
    with open(path) as f:
        result = json.load(f)
    if not isinstance(result, dict) or "rows" not in result:
        raise ValueError(f"{path} is not a bench result (a JSON object with 'rows'; write one with --json)")
    return pd.DataFrame(result["rows"])


def environment(device="cpu") -> dict:
    import transformers

    return {
        "device": str(device),
        "device_name": device_name(device),  # the GPU's name ('NVIDIA H200'), or the CPU's model
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "capability": capability(),  # the CPU's vector ISA and native reduced precisions: what auto decided from
        "float32_library": kernels.decisions(),  # which library multiplied float32 layers, as timed here (ssd.models.kernels)
        "kind": kind_slug(machine_kind(device)),  # the machine's folder in data/ (ssd.bench.machines)
        "commit": commit(),  # the kit's commit that measured it
    }


def bench_record(result: dict, pair, args: dict, profile=None, batch_profiles: dict | None = None) -> dict:
    """A result of ``ssd.bench.run.run_bench`` as a bench JSON keeps it (`python -m ssd bench --json`, a course run's
    results_dir): without the timeline's spans, with the arguments, the environment (this kind of machine, its commit
    and date), the precisions, the latency profile it was priced on and, where given, those of the other b."""
    kept = {key: value for key, value in result.items() if key != "spans"}
    record = {"args": args, "environment": environment(pair.target.device), "precision": pair.precisions.as_dict(),
              "forward": pair.forward, "profile": profile.to_dict() if profile else None}
    if batch_profiles is not None:
        record["batch_profiles"] = {str(b): p.to_dict() for b, p in batch_profiles.items() if b != 1}
    return record | kept


def stored(path: str, pair, *, other_precisions: bool = False) -> dict | None:
    """The bench result stored at `path` (`python -m ssd bench --json PATH`) if it exists and was measured on this pair
    at these precisions (each model's), with "source": the path and "elsewhere": None where it was measured on this
    kind of machine (``ssd.models.capability.machine_kind``), else one line saying where; otherwise None. Timings and
    the auto rule's reason do not count: they never repeat, even on the machine that stored the result.
    other_precisions: a bench of this pair at other precisions counts too (a notebook shows another machine's bench
    where this one has none), its "elsewhere" line naming the precisions it ran at."""
    if not (path and os.path.exists(path)):
        return None
    with open(path) as f:
        result = json.load(f)
    precision = result.get("precision") or {}
    same_pair = result.get("args", {}).get("pair") == pair.name
    same_precisions = (precision.get("target") == pair.precisions.target
                       and precision.get("draft") == pair.precisions.draft)
    forward = result.get("forward", "eager")  # a bench stored before forwards were recorded ran eager
    if not same_pair or not ((same_precisions and forward == pair.forward) or other_precisions):
        return None
    there, here = kind_of(result.get("environment", {})), machine_kind(pair.target.device)
    notes = [] if there == here else [f"on another kind of machine ({kind_line(there)}; this one: {kind_line(here)})"]
    if not same_precisions:
        notes.append(f"at target {precision.get('target')}, draft {precision.get('draft')} (this pair here: "
                     f"{pair.precisions.label})")
    if forward != pair.forward:
        notes.append(f"with {forward} forwards (this pair here: {pair.forward})")
    elsewhere = f"measured {' and '.join(notes)}: shown as stored, not re-measured" if notes else None
    return result | {"source": path, "elsewhere": elsewhere}


def stored_or_run(path: str, pair, prompts, methods: list[str], config: DecodeConfig, *, measure_missing: bool,
                  progress: bool = True, autotune: Autotune | None = None,
                  other_precisions: bool = False) -> dict | None:
    """The bench result stored at `path` if it was measured on this pair at these precisions (``stored``); otherwise,
    with measure_missing, the same methods run here on `prompts` (not written; the methods on auto with the
    autotune), and without it None: a notebook at its defaults never re-measures a long bench, it shows the stored
    one or says how to measure it. A result carries "source": the path, or "measured here".
    other_precisions: a stored bench of this pair at other precisions is shown rather than measured (``stored``)."""
    found = stored(path, pair, other_precisions=other_precisions)
    if found is not None or not measure_missing:
        return found
    result = run_bench(pair, prompts, methods, config, progress=progress, autotune=autotune)
    return result | {"source": "measured here", "elsewhere": None, "precision": pair.precisions.as_dict(),
                     "forward": pair.forward}


def machine_to_show(root: str, machine: str, device="cpu", having: str | None = None) -> str | None:
    """The folder of `root` (data/<machine>) whose stored benches a notebook shows: `machine` "nearest", this kind of
    machine's own where its folder holds the file `having`, else the nearest kind whose folder does
    (``machines.nearest``; None where none does); "here", this machine's folder, whether it holds them or not; or a
    stored machine's folder by name."""
    if machine == "nearest":
        return nearest(machine_kind(device), root, having=having)
    if machine == "here":
        return this_machine(device)
    names = stored_machines(root)
    if machine not in names:
        raise ValueError(f"machine must be 'nearest', 'here' or a stored machine of {root} ({', '.join(names)}); "
                         f"got {machine!r}")
    return machine


def profile_of(result: dict, folder: str) -> Profile | None:
    """The profile kept in `folder` (data/<machine>, its profiles/) for what a stored bench `result` ran: its pair, its
    precisions, its ranks' cores, at b = 1, on its kind of machine. A prediction drawn beside that bench is priced on
    it, so that predicted and measured are of one machine; None where the folder keeps none."""
    args, precision = result.get("args", {}), result.get("precision") or {}
    kind = kind_of(result.get("environment", {}))
    for path in sorted(glob.glob(os.path.join(folder, "profiles", "*.json"))):
        try:
            profile = load_profile(path)
        except (ValueError, TypeError, KeyError):
            continue  # not a profile
        if (profile.pair == args.get("pair") and profile.batch_size == 1
                and (profile.precisions.get("target"), profile.precisions.get("draft"))
                == (precision.get("target"), precision.get("draft"))
                and profile.verifier_cores == check_cores(args.get("verifier_cores", "0"), "verifier_cores")
                and profile.drafter_cores == check_cores(args.get("drafter_cores", "1"), "drafter_cores")
                and kind_of({"device": "cpu", "capability": profile.capability}) == kind):
            return profile
    return None


def not_stored_line(path: str, pair) -> str:
    """Why `stored` found nothing at `path` for this pair, in one line."""
    if not (path and os.path.exists(path)):
        return f"{path}: not measured yet"
    with open(path) as f:
        result = json.load(f)
    precision = result.get("precision") or {}
    return (f"{path}: measured on {result.get('args', {}).get('pair')} at target {precision.get('target')}, draft "
            f"{precision.get('draft')}, not on {pair.name} at {pair.precisions.label}")
