"""CPU cores: naming them ('0', '0,2', '0-3'), checking them, and running on them with one torch thread each.

Two processes pinned to one core each run side by side on a CPU as two devices (docs/pipeline.md, "SSD on two
ranks"); the profile measures each model on the cores its rank will have.
"""
from __future__ import annotations

import contextlib
import os

import torch


def parse_cores(spec, name: str) -> list[int]:
    """'0', '0,2', '0-3' or '0-1,4' -> the sorted core ids; a ValueError naming the parameter for anything else."""
    cores = set()
    for part in str(spec).split(","):
        lo, dash, hi = part.strip().partition("-")
        hi = hi if dash else lo
        if not (lo.isdigit() and hi.isdigit() and int(lo) <= int(hi)):
            raise ValueError(f"{name} must list CPU cores such as '0', '0,1' or '0-3'; got {spec!r}")
        cores.update(range(int(lo), int(hi) + 1))
    return sorted(cores)


def available_cores() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def check_cores(spec, name: str) -> list[int]:
    """parse_cores, and every core must be one this process may run on."""
    cores, allowed = parse_cores(spec, name), available_cores()
    missing = [c for c in cores if c not in allowed]
    if missing:
        raise ValueError(f"{name}={spec!r} names cores {missing} that this machine does not offer; it has {allowed}")
    return cores


def pin(cores: list[int]) -> None:
    """Run this thread, and the threads it starts from now on, on these cores with one torch thread per core."""
    if hasattr(os, "sched_setaffinity"):  # Linux; elsewhere only the thread count applies
        os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores))


@contextlib.contextmanager
def torch_threads(count: int):
    """torch's thread count for one call, the caller's back after (no affinity: see pinned for that)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def pinned(cores: list[int]):
    """pin for one call: the caller's cores and thread count come back after (the bench's other methods, a notebook's
    other cells). torch threads started earlier keep their cores; with one core per rank there are none."""
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    threads = torch.get_num_threads()
    pin(cores)
    try:
        yield
    finally:
        if affinity is not None:
            os.sched_setaffinity(0, affinity)
        torch.set_num_threads(threads)
