"""No notebook asserts a live timing that noise can reorder (issue 55: notebook 05 once failed a fresh `make test` on
two 2 ms verify passes compared on the tiny pair).

A notebook that measures here (it calls one of MEASURES) may assert on a timing only under an `if` that tells a
finding from a demonstration: a real pair (`pair_name`), stored benches (`stored_benches`), a stored study (`measure`).
A timing is any name or key the TIMING pattern matches (ms, seconds, tokens/s, speed-ups, v and c, busy shares, T_p).
Claims about stored data are asserted freely: a notebook that measures no timing here is not scanned. The scan reads
the stored files, so it needs no kernel.
"""
import ast
import json
import pathlib
import re

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# Calls that time the models here. (Notebook 06's live grid, run_sweep, is asserted on its count of points only.)
MEASURES = {"run_bench", "stored_or_run", "profiles_at", "cached_profile"}
TIMING = re.compile(r"_ms$|_s$|tokens_per_s|speedup|_busy$|_over_|seconds|apart$|^(v|c|t_p|t_b|wall|ms)$")
STRUCTURAL = "by construction"  # an assert whose line says so checks what the code makes true whatever the clock
GUARDS = {"pair_name", "stored_benches", "measure"}


def code_cells(notebook: pathlib.Path) -> list[tuple[int, ast.Module]]:
    cells = json.loads(notebook.read_text())["cells"]
    return [(i, parse("".join(cell["source"]))) for i, cell in enumerate(cells) if cell["cell_type"] == "code"]


def parse(source: str) -> ast.Module:
    """A cell's code, its lines kept on the tree (for STRUCTURAL); IPython's magics and shell lines blanked."""
    lines = ["" if line.startswith(("%", "!")) else line for line in source.splitlines()]
    tree = ast.parse("\n".join(lines))
    tree.lines = lines
    return tree


def words(node: ast.AST) -> set[str]:
    """The names, attributes and string keys an expression reads."""
    found = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            found.add(n.id)
        elif isinstance(n, ast.Attribute):
            found.add(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            found.add(n.value)
    return found


def measures_here(cells) -> bool:
    return any(isinstance(n, ast.Call) and (getattr(n.func, "attr", None) or getattr(n.func, "id", None)) in MEASURES
               for _, tree in cells for n in ast.walk(tree))


def unguarded_timing_asserts(cells) -> list[str]:
    """'cell N: line L' for every assert on a timing that no guard of GUARDS encloses."""
    found = []

    def visit(node, guarded: bool, cell: int, lines: list[str]):
        if (isinstance(node, ast.Assert) and not guarded and any(TIMING.search(w) for w in words(node.test))
                and STRUCTURAL not in lines[node.lineno - 1]):
            found.append(f"cell {cell}: line {node.lineno}: {ast.unparse(node.test)[:80]}")
        for child in ast.iter_child_nodes(node):
            visit(child, guarded or (isinstance(node, ast.If) and bool(words(node.test) & GUARDS)), cell, lines)

    for i, tree in cells:
        visit(tree, False, i, tree.lines)
    return found


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_notebook_asserts_an_unguarded_live_timing(notebook):
    cells = code_cells(notebook)
    if measures_here(cells):
        assert not unguarded_timing_asserts(cells), f"{notebook.name}: {unguarded_timing_asserts(cells)}"


def test_the_scan_catches_the_assert_that_failed_a_fresh_make_test():
    """Notebook 05's cell as it stood at cb2ef8b, beside the same assert under a real-pair guard."""
    old = parse('lanes = bench.run_bench(pair)\nsd_lanes, pipe_lanes = lanes.loc["sd"], lanes.loc["ssd-pipeline"]\n'
                    'assert pipe_lanes["verify_ms"] > sd_lanes["verify_ms"], lanes  # one core against two')
    assert measures_here([(0, old)]) and unguarded_timing_asserts([(22, old)]) == [
        'cell 22: line 3: pipe_lanes[\'verify_ms\'] > sd_lanes[\'verify_ms\']']
    guarded = parse('if pair_name != "tiny":\n    assert pipe["verify_ms"] > sd["verify_ms"]\n'
                        'assert rounds["sd"] < rounds["ar"]')
    assert unguarded_timing_asserts([(0, guarded)]) == []  # a round count is no timing
    structural = parse('assert sd["both_busy"] < 0.01  # never both at once, by construction\n'
                       'assert chosen["sd_speedup_at_a_0.8"] >= 0.9 * reference["sd_speedup_at_a_0.8"]')
    assert unguarded_timing_asserts([(7, structural)]) == [
        "cell 7: line 2: chosen['sd_speedup_at_a_0.8'] >= 0.9 * reference['sd_speedup_at_a_0.8']"]
    stored = parse('table = pd.read_csv(path)\nassert table["speedup"].min() > 1')
    assert not measures_here([(0, stored)])  # stored data: asserted freely
    assert sum(measures_here(code_cells(nb)) for nb in NOTEBOOKS) >= 3  # 05, 07, 08 measure (where asked)
