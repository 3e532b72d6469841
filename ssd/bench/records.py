"""A bench result kept on disk: the environment it records (the machine, torch, the CPU's capability, the float32
library), reading its rows back, and whether a stored result was measured on this pair, at these precisions, on this
kind of machine: a notebook shows a stored bench rather than re-measure it (``stored_or_run``)."""
from __future__ import annotations

import json
import os
import platform
from datetime import datetime, timezone

import pandas as pd
import torch

from ..models import kernels
from ..core.decoding import DecodeConfig
from ..models.capability import capability, device_name, kind_line, kind_of, kind_slug, machine_kind
from .machines import commit
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


def stored(path: str, pair) -> dict | None:
    """The bench result stored at `path` (`python -m ssd bench --json PATH`) if it exists and was measured on this pair
    at these precisions (each model's), with "source": the path and "elsewhere": None where it was measured on this
    kind of machine (``ssd.models.capability.machine_kind``), else one line saying where; otherwise None. Timings and
    the auto rule's reason do not count: they never repeat, even on the machine that stored the result."""
    if not (path and os.path.exists(path)):
        return None
    with open(path) as f:
        result = json.load(f)
    precision = result.get("precision") or {}
    same = (result.get("args", {}).get("pair") == pair.name and precision.get("target") == pair.precisions.target
            and precision.get("draft") == pair.precisions.draft)
    if not same:
        return None
    there, here = kind_of(result.get("environment", {})), machine_kind(pair.target.device)
    elsewhere = None if there == here else f"measured on another kind of machine ({kind_line(there)}; this one: " \
                                            f"{kind_line(here)}): shown as stored, not re-measured"
    return result | {"source": path, "elsewhere": elsewhere}


def stored_or_run(path: str, pair, prompts, methods: list[str], config: DecodeConfig, *, measure_missing: bool,
                  progress: bool = True, autotune: Autotune | None = None) -> dict | None:
    """The bench result stored at `path` if it was measured on this pair at these precisions (``stored``); otherwise,
    with measure_missing, the same methods run here on `prompts` (not written; the methods on auto with the
    autotune), and without it None: a notebook at its defaults never re-measures a long bench, it shows the stored
    one or says how to measure it. A result carries "source": the path, or "measured here"."""
    found = stored(path, pair)
    if found is not None or not measure_missing:
        return found
    result = run_bench(pair, prompts, methods, config, progress=progress, autotune=autotune)
    return result | {"source": "measured here", "elsewhere": None, "precision": pair.precisions.as_dict()}


def not_stored_line(path: str, pair) -> str:
    """Why `stored` found nothing at `path` for this pair, in one line."""
    if not (path and os.path.exists(path)):
        return f"{path}: not measured yet"
    with open(path) as f:
        result = json.load(f)
    precision = result.get("precision") or {}
    return (f"{path}: measured on {result.get('args', {}).get('pair')} at target {precision.get('target')}, draft "
            f"{precision.get('draft')}, not on {pair.name} at {pair.precisions.label}")
