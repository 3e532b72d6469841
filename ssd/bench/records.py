"""A bench result as it is kept on disk: the environment it records (the machine, torch, the CPU's capability, the
float32 library, the commit), the record a bench JSON holds, and its rows read back. Whether a stored result answers
for this pair here, and what a notebook shows, is read in ``ssd.analysis.stored_files``."""
from __future__ import annotations

import json
import os
import platform
from datetime import datetime, timezone

import pandas as pd
import torch

from ..models import kernels
from ..models.capability import capability, device_name, kind_slug, machine_kind
from .machines import commit


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
