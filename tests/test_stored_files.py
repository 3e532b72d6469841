"""ssd.analysis.stored_files: a stored table names the machine and precisions it was measured at, from data/index.csv,
its own columns or the caller, and fails where they disagree or none says; style.profiles_line names profiles'."""
import dataclasses
import json

import pandas as pd
import pytest

from ssd.analysis import sources, stored_files, style
from ssd.bench import machines
from ssd.core.latencies import Profile

HEADER = "path,machine,precision,commit,date,superseded_by,was,command,about\n"
CAP = {"cpu": "AMD EPYC", "isa": "AVX2", "flags": ["avx2"], "native": [], "cores": 2, "torch": "2"}


@pytest.fixture
def data(tmp_path):
    (tmp_path / "box").mkdir()
    (tmp_path / "box" / "bench.json").write_text(json.dumps({"environment": {"device": "cpu", "capability": CAP}}))
    pd.DataFrame({"prompt_id": ["a", "b"], "target_dtype": ["bfloat16"] * 2, "draft_dtype": ["int8"] * 2}).to_csv(
        tmp_path / "box" / "typed.csv", index=False)
    pd.DataFrame({"prompt_id": ["a"], "hit_rate": [0.5]}).to_csv(tmp_path / "box" / "bare.csv", index=False)
    (tmp_path / "index.csv").write_text(HEADER + "box/bench.json,box,float32/float32,abc1234,2026-12-01,,,,\n"
                                        "box/typed.csv,box,bfloat16/int8,abc1234,2026-12-02,,,,\n"
                                        "box/bare.csv,box,,def5678,2026-12-03,,,,\n")
    return str(tmp_path)


def test_a_stored_file_names_its_machine_precisions_commit_and_date(data):
    source = stored_files.stored(data, "box/bench.json")
    assert (source.machine, source.target, source.draft) == ("box", "float32", "float32")
    assert source.words == machines.describe(data, "box") == "AMD EPYC, AVX2 (avx2)"
    assert source.line == "AMD EPYC, AVX2 (avx2) · target float32, draft float32"
    assert str(source) == ("box/bench.json: measured on AMD EPYC, AVX2 (avx2) (data/box/) on 2026-12-01, target "
                           "float32, draft float32; stored at commit abc1234")


def test_a_table_checks_its_own_columns_against_the_index(data):
    frame, source = stored_files.stored_csv(data, "box/typed.csv")
    assert len(frame) == 2 and (source.target, source.draft) == ("bfloat16", "int8")
    with pytest.raises(ValueError, match="the table says bfloat16/int8; precision says float32/int8"):
        stored_files.stored_csv(data, "box/typed.csv", precision="float32/int8")
    with pytest.raises(ValueError, match="rows name machines"):
        stored_files.stored(data, "box/typed.csv", frame.assign(machine="elsewhere"))


def test_a_file_that_records_no_precision_takes_the_callers_or_fails(data):
    with pytest.raises(ValueError, match="records no precision"):
        stored_files.stored_csv(data, "box/bare.csv")
    _, source = stored_files.stored_csv(data, "box/bare.csv", precision="float32/int8")
    assert (source.target, source.draft, source.commit, source.date) == ("float32", "int8", "def5678", "2026-12-03")
    with pytest.raises(ValueError, match="precision must be 'TARGET/DRAFT'"):
        stored_files.stored_csv(data, "box/bare.csv", precision="float32")


def test_a_file_the_index_does_not_list_fails_before_it_is_read(data, tmp_path):
    with pytest.raises(ValueError, match="listed 0 times"):
        stored_files.stored_csv(data, "box/missing.csv")
    with pytest.raises(ValueError, match="data_dir must hold index.csv"):
        stored_files.stored(str(tmp_path / "box"), "bench.json")


def profile(target, draft, batch_size=1, cpu="AMD EPYC"):
    return Profile(pair="pair", precisions={"target": target, "draft": draft}, capability=CAP | {"cpu": cpu},
                   verifier_cores=[0], drafter_cores=[1], context=64, target_ms={1: 10.0, 5: 20.0}, draft_ms={1: 2.0},
                   bandwidth_gbs={"target": 10.0, "draft": 10.0}, step_bytes={"target": 1, "draft": 1},
                   measured_at="2026-12-01T00:00:00", glue_ms={1: 0.1}, batch_size=batch_size)


def test_stored_profiles_are_the_b1_ones_float32_first(data, tmp_path):
    from ssd.bench.profile import save

    folder = tmp_path / "box" / "profiles"
    folder.mkdir()
    for name, p in {"a": profile("bfloat16", "int8"), "b": profile("float32", "float32"),
                    "c": profile("bfloat16", "int8", batch_size=4),
                    "d": dataclasses.replace(profile("bfloat16", "int8"), forward="compiled")}.items():
        save(p, folder / f"{name}.json")
    found = stored_files.stored_profiles(data, "box")
    assert list(found) == ["target float32, draft float32", "target bfloat16, draft int8",
                           "target bfloat16, draft int8, compiled forwards"]  # beside its eager one, not over it
    with pytest.raises(ValueError, match="has none"):
        stored_files.stored_profiles(data, "nowhere")


def test_profiles_line_names_each_machine_and_every_precision():
    line = style.profiles_line({"target float32, draft float32": profile("float32", "float32"),
                                "target bfloat16, draft int8": profile("bfloat16", "int8")})
    assert line == ("AMD EPYC (2 cores), AVX2, no native bfloat16 or float16 · target float32, draft float32; "
                    "target bfloat16, draft int8")
    two = style.profiles_line({"x": profile("float32", "float32"), "y": profile("float32", "float32", cpu="Xeon")})
    assert two.count(" · ") == 2
    with pytest.raises(ValueError, match="at least one profile"):
        style.profiles_line({})


def test_one_record_type_holds_a_stored_file_for_the_report_and_the_notebooks():
    """A stored file is one kind of record wherever it is read (issue 57): no second Source-like class."""
    import ast
    import pathlib

    import ssd

    found = []
    for path in pathlib.Path(ssd.__file__).parent.rglob("*.py"):
        found += [f"{path.name}:{n.name}" for n in ast.walk(ast.parse(path.read_text()))
                  if isinstance(n, ast.ClassDef) and "source" in n.name.lower()]
    assert found == ["sources.py:Source"], found
    data = str(pathlib.Path(ssd.__file__).parent.parent / "data")
    assert isinstance(stored_files.stored(data, "intel-xeon-amx/saguaro.csv"), sources.Source)


def test_a_bench_a_notebook_shows_is_read_as_the_report_reads_it():
    """One reader: stored_bench's source is the Source the report's folder reader makes of the same file (its
    precision, forward, settings, date and commit from data/index.csv, machine), rows included."""
    from types import SimpleNamespace

    import torch

    from ssd.models.auto_precision import Precisions

    path = "data/amd-epyc-avx512-bf16/llamacpp_humaneval.json"
    pair = SimpleNamespace(name="qwen2.5-coder", precisions=Precisions("bfloat16", "int8", "stub"), forward="eager",
                           target=SimpleNamespace(device=torch.device("cpu")))
    shown = stored_files.stored_bench(path, pair, other_precisions=True)["source"]
    read = next(s for s in sources.read_folder("data/amd-epyc-avx512-bf16")
                if s.name == "llamacpp_humaneval.json" and s.kind == sources.BENCH)
    fields = ("name", "kind", "precision", "auto", "settings", "date", "commit", "forward", "machine")
    assert [getattr(shown, f) for f in fields] == [getattr(read, f) for f in fields]
    pd.testing.assert_frame_equal(shown.frame, read.frame)
    assert shown.commit != sources.UNKNOWN and str(shown).startswith("amd-epyc-avx512-bf16/llamacpp_humaneval.json")
