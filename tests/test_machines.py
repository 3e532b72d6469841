"""data/ by machine: each kind of machine's folder is named by its kind, the index lists every stored file, and the
nearest stored machine stands in for one that has none of its own."""
import csv
import json
import os

import pandas as pd
import pytest

from ssd.bench import machines
from ssd.models.capability import kind_of, kind_slug

AVX2 = {"device": "cpu", "device_name": "AMD EPYC 7B13", "isa": "AVX2", "flags": ["avx2"]}
XEON_AMX = {"device": "cpu", "device_name": "Intel(R) Xeon(R) Platinum 8480+", "isa": "AVX512",
            "flags": ["amx_bf16", "amx_int8", "avx2", "avx512_bf16", "avx512f"]}


@pytest.mark.parametrize("kind,slug", [
    (AVX2, "amd-epyc-7b13-avx2"),
    (XEON_AMX, "intel-xeon-platinum-8480-amx"),
    ({"device": "cpu", "device_name": "AMD EPYC", "isa": "AVX512", "flags": ["avx2", "avx512f", "avx512_bf16"]},
     "amd-epyc-avx512-bf16"),
    ({"device": "cuda", "device_name": "NVIDIA H200", "isa": None, "flags": []}, "nvidia-h200"),
    ({"device": "cpu", "device_name": None, "isa": None, "flags": []}, "unrecorded-cpu"),
])
def test_a_kind_of_machine_names_its_folder(kind, slug):
    assert kind_slug(kind) == slug


def test_every_stored_folder_holds_the_kind_it_is_named_for():
    stored = machines.stored_machines()
    assert {"amd-epyc-avx2", "amd-epyc-avx512-bf16", "intel-xeon-amx", "nvidia-h200"} <= set(stored)
    for machine in stored:
        assert kind_slug(machines.kind_in(machines.DATA, machine)) == machine


def test_the_index_lists_every_stored_file_once_and_nothing_else():
    with open(os.path.join(machines.DATA, machines.INDEX)) as f:
        rows = list(csv.DictReader(f))
    listed = [row["path"] for row in rows]
    on_disk = sorted(os.path.relpath(os.path.join(d, name), machines.DATA) for d, _, names in os.walk(machines.DATA)
                     for name in names if name not in ("README.md", machines.INDEX) and "demo" not in d)
    assert sorted(listed) == on_disk
    for row in rows:
        assert row["machine"] and row["commit"] and row["date"][:2] == "20", row
        assert not row["superseded_by"] or row["superseded_by"] in listed, row  # what superseded it is stored too
        assert row["path"].startswith(machines.ARCHIVE + "/") == bool(row["superseded_by"]), row


def test_the_nearest_stored_machine_stands_in_for_an_unknown_one():
    assert machines.nearest(AVX2) == "amd-epyc-avx2"
    assert machines.nearest(XEON_AMX) == "intel-xeon-amx"
    on_a_gpu = {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "isa": None, "flags": []}
    assert machines.nearest(on_a_gpu) == "nvidia-h200"
    assert machines.nearest(AVX2, having="no-such-file.json") is None


def test_provenance_names_the_machine_commit_and_date():
    record = machines.provenance()
    assert record["machine"] == machines.this_machine() and record["date"].startswith("20")
    assert len(record["commit"]) == 7 and int(record["commit"], 16) >= 0  # this checkout's HEAD


def stored_files() -> list[dict]:
    with open(os.path.join(machines.DATA, machines.INDEX)) as f:
        return list(csv.DictReader(f))


def folder_of(path: str) -> str:
    """The machine a stored file's folder names: data/<machine>/... or data/archive/<machine>/..."""
    parts = path.split("/")
    return parts[1] if parts[0] == machines.ARCHIVE else parts[0]


def json_provenance(record: dict) -> dict:
    """Where a stored JSON records its machine, commit, date and precision (data/README.md)."""
    if "environment" in record:  # a bench
        env = record["environment"]
        return {"machine": env.get("kind"), "commit": env.get("commit"), "commit_is": env.get("commit_is"),
                "date": env.get("date"), "precision": record.get("precision")}
    if "target_ms" in record:  # a profile: its machine is the CPU it timed
        return {"machine": kind_slug(kind_of({"device": "cpu", "capability": record["capability"]})),
                "commit": record.get("commit"), "commit_is": record.get("commit_is"), "date": record.get("measured_at"),
                "precision": record.get("precisions")}
    return {"machine": record.get("kind"), "commit": record.get("commit"), "commit_is": record.get("commit_is"),
            "date": record.get("date"), "precision": record.get("precisions")}


@pytest.mark.parametrize("row", stored_files(), ids=lambda row: row["path"])
def test_every_stored_result_records_its_machine_precision_commit_and_date(row):
    """Issue 49: every stored result names the machine, the commit and the date (and the precision where it has one);
    a commit filled in after the fact is the one index.csv says stored the file, and says so."""
    path = os.path.join(machines.DATA, row["path"])
    if path.endswith(".json"):
        with open(path) as f:
            found = json_provenance(json.load(f))
        assert found["machine"] == folder_of(row["path"]), found
        assert found["commit"] and str(found["date"]).startswith("20"), found
        if found["commit_is"]:  # backfilled from the index
            assert found["commit_is"] == "the commit that stored it" and found["commit"] == row["commit"], found
        if found["precision"]:
            assert row["precision"] == f"{found['precision']['target']}/{found['precision']['draft']}", row
        return
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    for column in ("machine", "commit", "date"):
        assert column in table and (table[column] != "").all(), column
    assert table.date.str.startswith("20").all()
    if "commit_is" in table:
        assert set(table.commit_is) == {"the commit that stored it"} and set(table.commit) == {row["commit"]}
    for column in ("target_dtype", "draft_dtype", "precision"):
        assert column not in table or (table[column] != "").all(), column
    if "target_dtype" in table:
        assert set(table.target_dtype + "/" + table.draft_dtype) == {row["precision"]}, row


def benches() -> list[tuple[dict, dict]]:
    """Each stored bench JSON's index row and arguments."""
    found = []
    for row in stored_files():
        if row["path"].endswith(".json"):
            with open(os.path.join(machines.DATA, row["path"])) as f:
                args = json.load(f).get("args") or {}
            found += [(row, args)] if args.get("command") == "bench" else []
    return found


@pytest.mark.parametrize("row,args", benches(), ids=lambda x: x.get("path", ""))
def test_a_bench_json_is_indexed_with_the_command_its_arguments_give(row, args):
    """index.csv's command of a bench JSON is the one its recorded arguments rebuild: the methods, the prompts and the
    file itself named, never 'the same ...'."""
    command = row["command"]
    assert command.startswith("`python -m ssd bench ") and f"--json data/{row['path']}" in command, command
    assert f"--methods {args['methods']}" in command and args["prompts"].strip("'") in command, command
