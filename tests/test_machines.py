"""data/ by machine: each kind of machine's folder is named by its kind, the index lists every stored file, and the
nearest stored machine stands in for one that has none of its own."""
import csv
import os

import pytest

from ssd.bench import machines
from ssd.models.capability import kind_slug

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
