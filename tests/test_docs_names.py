"""What the documents name exists: every module path (``ssd.bench.run.answer_order``) in the README, the Makefile,
docs/, data/README.md, notebooks/README.md and data/index.csv resolves in the package as it is now; every file of the
repository they name in code (``docs/usage.md``, ``data/<kind>/x.json``) is there; and no row of data/index.csv
describes its file with another machine's files. Modules move and results are archived; a stale name is caught here
rather than by a reader. The journal (docs/journal.md) records what was true on its day and is not checked."""
import ast
import csv
import functools
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", ROOT / "Makefile", ROOT / "data" / "README.md", ROOT / "notebooks" / "README.md",
             *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "journal.md")]
INDEX = ROOT / "data" / "index.csv"

MODULE_PATH = re.compile(r"(?<![\w./-])(ssd(?:\.[A-Za-z_]\w*)+)")
# a file of the repository named in prose or code: a placeholder (<machine>, {machine}) is a pattern, not a file
REPO_PATH = re.compile(r"(?<![\w./<>{}-])((?:docs|data|notebooks|ssd|tests|figures|sweeps|\.ci)/[\w./+-]*\w"
                       r"\.(?:md|py|json|csv|ipynb|png|cfg|txt|yaml))(?![\w<>{}])")
DIGEST = re.compile(r"_([0-9a-f]{8})\.json")


def module_file(name: str) -> pathlib.Path | None:
    base = ROOT.joinpath(*name.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


@functools.cache
def top_level(path: pathlib.Path) -> tuple[dict, set]:
    """A module's classes (name -> their member names) and every name it binds at the top, read without importing it
    (importing a module such as ssd.torchrun runs it). A lazy export table (ssd/__init__.py's _EXPORTS) counts."""
    tree, classes, names = ast.parse(path.read_text()), {}, set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            classes[node.name] = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))} | {
                t.id for n in node.body for t in bound(n) if isinstance(t, ast.Name)}
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        for target in bound(node):
            names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            if getattr(target, "id", None) == "_EXPORTS" and isinstance(node.value, ast.Dict):
                names.update(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    return classes, names


def bound(node) -> list:
    if isinstance(node, ast.Assign):
        return node.targets
    return [node.target] if isinstance(node, ast.AnnAssign) else []


def resolves(dotted: str) -> bool:
    """ssd.a.b: the longest prefix that is a module of the package, then a top-level name of it, then (at most) a
    member of that class."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        path = module_file(".".join(parts[:i]))
        if path is None:
            continue
        rest = parts[i:]
        if not rest:
            return True
        classes, names = top_level(path)
        if rest[0] not in names:
            return False
        return len(rest) == 1 or rest[0] not in classes or rest[1] in classes[rest[0]]
    return False


def index_rows() -> list[dict]:
    with open(INDEX, newline="") as f:
        return list(csv.DictReader(f))


def unresolved(text: str) -> list[str]:
    return sorted({m for m in MODULE_PATH.findall(text) if not resolves(m)})


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_path_a_document_names_exists(path):
    assert unresolved(path.read_text()) == []


def test_every_module_path_in_the_index_exists():
    assert [(row["path"], m) for row in index_rows() for m in unresolved(row["command"] + " " + row["about"])] == []


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_file_a_document_names_exists(path):
    assert sorted({p for p in REPO_PATH.findall(path.read_text()) if not (ROOT / p).exists()}) == []


def other_machines_files(row: dict, machines: set[str]) -> list[str]:
    """What a row's command and description name of another machine: its folder (data/<kind>/), or a profile digest
    (`*_2ce497e7.json`) other than its file's own."""
    text = row["command"] + " " + row["about"]
    found = [f"data/{m}/" for m in re.findall(r"data/([\w-]+)/", text) if m in machines and m != row["machine"]]
    own = DIGEST.findall(row["path"])
    return found + ([f"_{d}.json" for d in DIGEST.findall(text) if d not in own] if own else [])


def test_no_index_row_describes_its_file_with_another_machines():
    machines = {p.name for p in (ROOT / "data").iterdir() if p.is_dir() and p.name != "archive"}
    assert [(row["path"], other_machines_files(row, machines)) for row in index_rows()
            if other_machines_files(row, machines)] == []


def test_the_checks_catch_what_they_are_for():
    assert resolves("ssd.bench.run.answer_order") and resolves("ssd.core.tuning.Autotune.calibrator")
    assert resolves("ssd.load_pair") and resolves("ssd.models")  # a lazy export, a package
    assert not resolves("ssd.bench.answer_order") and not resolves("ssd.profile.answers_for")
    assert not resolves("ssd.core.tuning.Autotune.carried_calibrator")
    assert REPO_PATH.findall("see docs/engines.md, data/<machine>/x.json and `data/a/b.csv`") == [
        "docs/engines.md", "data/a/b.csv"]
    copied = {"path": "intel-xeon-amx/profiles/p_f3bdb07b.json", "machine": "intel-xeon-amx", "command": "",
              "about": "`*_2ce497e7.json`: the AMD EPYC's, in data/amd-epyc-avx2/"}
    assert other_machines_files(copied, {"intel-xeon-amx", "amd-epyc-avx2"}) == ["data/amd-epyc-avx2/",
                                                                                  "_2ce497e7.json"]
