"""The package's layering: imports flow one way, so no module of ssd/ reaches back up to one that imports it."""
import ast
import pathlib

import ssd

PACKAGE = pathlib.Path(ssd.__file__).parent


def imports(path: pathlib.Path) -> set[str]:
    """The ssd modules a file imports, at its top or inside a function (a local import still makes a cycle)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level == 1:  # from .x import y, or from . import x, y
            found.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
        elif node.level == 0 and node.module and node.module.split(".")[0] == "ssd":
            parts = node.module.split(".")
            found.update([parts[1]] if len(parts) > 1 else [a.name for a in node.names])
    return found - {path.stem}


def graph() -> dict[str, set[str]]:
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    return {p.stem: imports(p) & modules for p in PACKAGE.glob("*.py")}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path [a, b, ..., a], or None: a depth-first search for an edge back onto its stack."""
    state, stack = {}, []

    def visit(module):
        state[module] = "open"
        stack.append(module)
        for dep in sorted(edges.get(module, ())):
            if state.get(dep) == "open":
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[module] = "done"
        return None

    for module in sorted(edges):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle_and_accepts_a_chain():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_in_the_package():
    edges = graph()
    assert {"cli", "pipeline", "methods", "models"} <= set(edges)  # the graph was read, not empty
    assert "commands" in edges["cli"] and "methods" in edges["commands"] and "pipeline" in edges["methods"]
    found = cycle(edges)
    assert found is None, f"import cycle: {' -> '.join(found)}"


def test_the_pipeline_knows_nothing_of_the_command_line():
    assert not graph()["pipeline"] & {"cli", "commands", "torchrun", "bench", "course", "sweep"}


def test_only_the_launchers_import_the_command_line():
    # cli is on top: __main__ (python -m ssd), execute (python -m ssd.execute, a sweep point) and torchrun
    # (python -m ssd.torchrun) only start it.
    assert sorted(m for m, deps in graph().items() if "cli" in deps) == ["__main__", "execute", "torchrun"]
    assert not [m for m, deps in graph().items() if deps & {"__main__", "execute", "torchrun"}]  # nothing imports them
    # and the commands it runs only by the command line, which imports them once its arguments are parsed
    assert [m for m, deps in graph().items() if "commands" in deps] == ["cli"]


def test_all_drafting_goes_through_the_proposer_interface():
    """The drafting internals (the tree pre-speculation, the n-gram lookup) are called only inside their own module;
    everything else drafts through propose / observe (ssd.proposers)."""
    # The tree's home is ssd.tree; ssd drafts with it, and the profile times one depth of it (a measurement, no draft).
    internals = {"draft_tree": {"tree", "ssd", "profile"}, "branch_drafts": {"ssd"}, "ngram_proposal": {"proposers"}}
    for path in PACKAGE.glob("*.py"):
        names = {n.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)}
        outside = {name for name, homes in internals.items() if name in names and path.stem not in homes}
        assert not outside, f"{path.name} calls {sorted(outside)} outside its module"


def test_the_pipeline_is_split_by_idea():
    edges = graph()
    # The lifecycle uses the protocol and the transport; the protocol the transport; the transport neither.
    assert {"protocol", "transport"} <= edges["pipeline"] and "transport" in edges["protocol"]
    assert not edges["transport"] & {"protocol", "pipeline", "ssd", "decoding"}
    assert "pipeline" not in edges["protocol"]
