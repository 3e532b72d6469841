"""What a user's run of the course keeps of what it measured: a notebook that benches the methods saves its result
into its `results_dir` (OUT/results/<machine>, given by ``ssd.course.notebooks``) as `python -m ssd bench --json`
writes one ({"args", "environment", "precision", "profile", "rows", "summary", ...}), so that `python -m ssd report
--from` reads a user's run as it reads the stored benches in data/<machine>/."""
from __future__ import annotations

import dataclasses

from ..bench import records
from ..core.decoding import DecodeConfig
from ..files import write_json

# The config's fields under the names the bench's command line records them by
CLI_NAMES = {"fan_out_strategy": "fan_out"}


def bench_args(pair, config: DecodeConfig, *, notebook: str, prompts: str, methods: list[str], batch_size: int,
               device: str, target_dtype: str, draft_dtype: str, seed: int = 0) -> dict:
    """The settings of a notebook's bench in the form of a bench JSON's "args" (the precisions as asked: "auto",
    say; the result's "precision" holds what they resolved to)."""
    fields = {CLI_NAMES.get(name, name): value for name, value in dataclasses.asdict(config).items()}
    return {"command": "course", "notebook": notebook, "pair": pair.name, "device": device,
            "target_dtype": target_dtype, "draft_dtype": draft_dtype, **fields, "batch_size": batch_size,
            "seed": seed, "methods": ",".join(methods), "prompts": prompts}


def save_bench(path: str, result: dict, pair, config: DecodeConfig, *, profile=None, **settings) -> str:
    """Write a notebook's bench to `path` whole or not at all (``bench_args`` names the settings); returns the path."""
    if not str(path).endswith(".json"):
        raise ValueError(f"path must end in .json (a bench result), got {path!r}")
    write_json(path, records.bench_record(result, pair, bench_args(pair, config, **settings), profile))
    return path
