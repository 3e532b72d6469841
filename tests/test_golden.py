"""The golden test: every method's tokens and rounds on a tiny pair, for fixed seeds, pinned in a file.

Written before the proposer interface and the pipeline split (issue 12) and kept after it: a refactor that changes
what any method draws, accepts or caches changes a line of tests/data/golden.json. Regenerate the file only for a
change meant to alter behaviour, and say so in the commit:

    python -m tests.test_golden      # rewrites tests/data/golden.json
"""
from __future__ import annotations

import json
import pathlib

import pytest
import torch

from ssd.core.decoding import DecodeConfig
from ssd.bench.methods import get_method
from ssd.models.tiny import tiny_pair
from ssd.pipeline.launch import PipelineConfig, close_pipelines
from ssd.core.speculation import SSDConfig

GOLDEN = pathlib.Path(__file__).parent / "data" / "golden.json"
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
SEEDS = (0, 1)
TEMPERATURES = (0.0, 0.8)
NEW_TOKENS = 24

# (case name, method, config fields): every method, and each SSD option that changes what is drafted or cached.
CASES = [
    ("ar", "ar", {}),
    ("sd", "sd", {"k": 3}),
    ("sd-1core", "sd-1core", {"k": 3}),
    ("hf-ar", "hf-ar", {}),
    ("hf-sd", "hf-sd", {"k": 3}),
    ("ssd-uniform", "ssd", {"k": 3, "budget": 6}),
    ("ssd-geometric", "ssd", {"k": 3, "budget": 6, "fan_out_strategy": "geometric"}),
    ("ssd-calibrated", "ssd", {"k": 3, "budget": 8, "fan_out_strategy": "calibrated"}),
    ("ssd-saguaro", "ssd", {"k": 3, "budget": 6, "saguaro_c": 0.5}),
    ("ssd-fast", "ssd", {"k": 3, "budget": 1, "backup": "fast"}),
    ("ssd-b0", "ssd", {"k": 2, "budget": 0}),
    ("ssd-pipeline", "ssd-pipeline", {"k": 3, "budget": 6, "fan_out_strategy": "calibrated"}),
]
# What a round's record must keep; times are left out (they are measurements, not behaviour).
ROUND_FIELDS = ("draft_len", "accepted", "token", "new_tokens", "hit", "rank", "fan_out", "a_p", "r", "backup")


def config_for(method: str, fields: dict, temperature: float):
    kind = {"ssd": SSDConfig, "ssd-pipeline": PipelineConfig}.get(method, DecodeConfig)
    return kind(temperature=temperature, max_new_tokens=NEW_TOKENS, **fields)


def record(pair, method: str, fields: dict, temperature: float, seed: int) -> dict:
    tokens, trace = get_method(method)(pair, PROMPT, config_for(method, fields, temperature),
                                       torch.Generator().manual_seed(seed))
    rounds = []
    for r in trace.rounds:
        row = {name: getattr(r, name, None) for name in ROUND_FIELDS}
        row["fan_out"] = list(row["fan_out"]) if row["fan_out"] is not None else None
        for name in ("a_p", "r"):
            row[name] = None if row[name] is None else round(row[name], 6)
        rounds.append(row)
    return {"tokens": list(tokens), "rounds": rounds}


def key(case: str, temperature: float, seed: int) -> str:
    return f"{case} T={temperature} seed={seed}"


def compute_all() -> dict:
    pair = tiny_pair()
    try:
        return {key(case, t, s): record(pair, method, fields, t, s)
                for case, method, fields in CASES for t in TEMPERATURES for s in SEEDS}
    finally:
        close_pipelines()


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


@pytest.mark.parametrize("case", [c[0] for c in CASES])  # the ssd-pipeline case is an integration test (conftest)
def test_every_method_draws_the_pinned_tokens_and_rounds(pair, case):
    """Each case on its own: a method's runs start no process unless the method is the pipeline, whose case then
    runs in the integration tier, and the unit tier stays free of subprocesses."""
    golden = json.loads(GOLDEN.read_text())
    _, method, fields = next(c for c in CASES if c[0] == case)
    try:
        for t in TEMPERATURES:
            for s in SEEDS:
                now, k = record(pair, method, fields, t, s), key(case, t, s)
                assert now["tokens"] == golden[k]["tokens"], f"{k}: tokens moved"
                assert now["rounds"] == golden[k]["rounds"], f"{k}: rounds moved"
    finally:
        close_pipelines()


def test_the_golden_file_covers_every_method():
    from ssd.bench.methods import METHODS
    from ssd.names import ENGINE_AR

    golden = json.loads(GOLDEN.read_text())
    # llama.cpp's methods run a registered pair's GGUF files, never the tiny pair (tests/test_llamacpp.py)
    assert {method for _, method, _ in CASES} == set(METHODS) - set(ENGINE_AR)
    assert set(golden) == {key(c, t, s) for c, _, _ in CASES for t in TEMPERATURES for s in SEEDS}


if __name__ == "__main__":
    torch.set_num_threads(1)
    tmp = GOLDEN.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(compute_all(), indent=0, sort_keys=True) + "\n")
    tmp.replace(GOLDEN)
    print(f"wrote {GOLDEN}")
