"""The package's layering: subpackages by concern, imports that flow one way, no module that reaches back up to one
that imports it, and an algorithm (``ssd.core``) that knows nothing of measurement, hardware or the command line."""
import ast
import importlib
import pathlib
import re

import ssd

PACKAGE = pathlib.Path(ssd.__file__).parent
# The torch-free leaves every layer may import (names, the checks of what a user gives, atomic files, the clocks that
# measure; the core imports none of the last: it is handed a clock, test_the_core_knows_nothing_of_measurement).
LEAVES = ("names", "checks", "files", "clock")
# The subpackages from the bottom up: each may import the leaves and those below it, never one above.
LAYERS = ("core", "models", "llamacpp", "pipeline", "bench", "analysis", "course")
# The command line and its launchers sit on top of every layer.
TOP = ("commands", "cli", "__main__", "execute", "torchrun")


def module_name(path: pathlib.Path) -> str:
    """ssd/core/verify.py -> "core.verify"; ssd/cli.py -> "cli"; ssd/core/__init__.py -> "core"."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(path: pathlib.Path, known: set[str]) -> set[str]:
    """The ssd modules a file imports, at its top or inside a function (a local import still makes a cycle)."""
    here = module_name(path).split(".")
    package = here if path.stem == "__init__" else here[:-1]  # what a relative import starts from
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            stem = base + (node.module.split(".") if node.module else [])
        elif node.module and node.module.split(".")[0] == "ssd":
            stem = node.module.split(".")[1:]
        else:
            continue
        for alias in node.names:  # `from .bench import stats` imports a module; `from .stats import x` a name
            candidate = ".".join(stem + [alias.name])
            found.add(candidate if candidate in known else ".".join(stem))
    return {m for m in found if m in known} - {module_name(path)}


def graph() -> dict[str, set[str]]:
    known = set(modules())
    return {name: imports(path, known) for name, path in modules().items()}


def layer(module: str) -> str:
    return module.split(".")[0]


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


def test_the_import_reader_resolves_relative_and_absolute_imports(tmp_path):
    edges = graph()
    assert "core.verify" in edges["core.decoding"]  # from .verify import ...
    assert "checks" in edges["core.decoding"]  # from ..checks import ...
    assert "bench.stats" in edges["commands"]  # from .bench import stats


def test_no_import_cycle_in_the_package():
    found = cycle(graph())
    assert found is None, f"import cycle: {' -> '.join(found)}"


def test_at_most_ten_modules_at_the_top_level():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 10, top
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(LAYERS)


def test_imports_flow_one_way_through_the_layers():
    """core < models < llamacpp < pipeline < bench < analysis < course < the command line; the leaves below them
    all."""
    order = {name: i for i, name in enumerate(LEAVES + LAYERS + TOP)}
    leaves = set(LEAVES)
    upward = []
    for module, deps in graph().items():
        for dep in deps:
            here, there = layer(module), layer(dep)
            if here in leaves and there not in leaves:
                upward.append(f"{module} -> {dep}")
            elif here not in leaves and there not in leaves and order[there] > order[here] and here != "__init__":
                upward.append(f"{module} -> {dep}")
    assert not upward, "imports against the layers: " + ", ".join(sorted(upward))


def test_the_core_imports_only_itself_and_the_leaves():
    outside = {f"{m} -> {d}" for m, deps in graph().items() if layer(m) == "core"
               for d in deps if layer(d) not in ("core",) + LEAVES}
    assert not outside, sorted(outside)


def test_the_core_knows_nothing_of_measurement():
    """The algorithm imports neither pandas nor time nor the clocks: a caller that measures hands a loop a clock
    (``ssd.clock.Stopwatch``), and tables of its records are ``ssd.bench.frames``'."""
    found = []
    for name, path in modules().items():
        if layer(name) != "core":
            continue
        tree = ast.parse(path.read_text())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and
                  not n.level}
        found += [f"{name} imports {m}" for m in sorted(names & {"pandas", "time", "timeit"})]
        found += [f"{name} imports clock" for d in graph()[name] if d == "clock"]
    assert not found, found


def test_the_leaves_do_not_import_torch():
    for leaf in LEAVES:
        tree = ast.parse((PACKAGE / f"{leaf}.py").read_text())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert "torch" not in names, leaf


def test_no_module_level_state_in_the_core_holds_what_a_run_learnt():
    """What a run on auto learns (calibrators, tuners) is an object the caller holds: no module of ssd.core keeps a
    weak map, or a mutable dict, list or set under a name that is not a constant's (UPPER_CASE, never written to), at
    its top level, nor declares a global."""
    mutable = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
    found = []
    for name, path in modules().items():
        if layer(name) != "core":
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:
            value = getattr(node, "value", None)
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                constant = all(isinstance(t, ast.Name) and t.id.isupper() for t in targets)
                weak = isinstance(value, ast.Call) and "Weak" in ast.unparse(value.func)
                if (isinstance(value, mutable) and not constant) or weak:
                    found.append(f"{name}: {ast.unparse(node)[:60]}")
        found += [f"{name}: global {', '.join(n.names)}" for n in ast.walk(tree) if isinstance(n, ast.Global)]
    assert not found, found


def test_the_pipeline_knows_nothing_of_the_command_line_nor_the_bench():
    assert not {d for m, deps in graph().items() if layer(m) == "pipeline" for d in deps
                if layer(d) in ("bench", "analysis", "course") + TOP}


def test_only_the_launchers_import_the_command_line():
    # cli is on top: __main__ (python -m ssd), execute (python -m ssd.execute, a sweep point) and torchrun
    # (python -m ssd.torchrun) only start it.
    edges = graph()
    assert sorted(m for m, deps in edges.items() if "cli" in deps) == ["__main__", "execute", "torchrun"]
    assert not [m for m, deps in edges.items() if deps & {"__main__", "execute", "torchrun"}]  # nothing imports them
    # and the commands it runs only by the command line, which imports them once its arguments are parsed
    assert [m for m, deps in edges.items() if "commands" in deps] == ["cli"]


def test_all_drafting_goes_through_the_proposer_interface():
    """The drafting internals (the tree pre-speculation, the n-gram lookup) are called only inside their own module;
    everything else drafts through propose / observe (ssd.core.proposers)."""
    # The tree's home is ssd.core.tree; SSD drafts with it, and the profile times one depth of it (a measurement).
    internals = {"draft_tree": {"core.tree", "core.speculation", "bench.profile"},
                 "branch_drafts": {"core.speculation"}, "ngram_proposal": {"core.proposers"}}
    for name, path in modules().items():
        tree = ast.parse(path.read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        outside = {fn for fn, homes in internals.items() if fn in names and name not in homes}
        assert not outside, f"{name} calls {sorted(outside)} outside its module"


def test_the_pipeline_is_split_by_idea():
    edges = graph()
    # The launch uses the protocol and the transport; the protocol the transport; the transport neither.
    assert {"pipeline.protocol", "pipeline.transport"} <= edges["pipeline.launch"]
    assert "pipeline.transport" in edges["pipeline.protocol"]
    assert not edges["pipeline.transport"] & {"pipeline.protocol", "pipeline.launch"}
    assert "pipeline.launch" not in edges["pipeline.protocol"]


def loop_of(module: str, function: str) -> ast.While:
    tree = ast.parse((PACKAGE / f"{module.replace('.', '/')}.py").read_text())
    found = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function)
    return next(n for n in ast.walk(found) if isinstance(n, ast.While))


def test_the_round_loops_fit_on_a_screen_and_call_no_tuner_nor_calibrator():
    """SD's loop and SSD's (the verifier's three steps, for one process and the pipeline alike) each at most 40 lines;
    the tuning observes their verdicts from outside (ssd.core.tuning.DraftLengths, the speculator), and the clock
    they mark their phases on is the caller's."""
    for module, function in (("core.decoding", "generate_sd"), ("core.decoding", "generate_ar"),
                             ("core.round", "verify_rounds")):
        loop = loop_of(module, function)
        assert loop.end_lineno - loop.lineno + 1 <= 40, function
        called = {ast.unparse(n.func) for n in ast.walk(loop) if isinstance(n, ast.Call)}
        assert not {c for c in called if any(w in c.lower() for w in ("tuner", "calibrator", "stopwatch", "time."))}, \
            (function, called)


def test_the_cores_glossary_names_what_the_core_has():
    """ssd/core/__init__.py lists the core's modules in reading order and its words; each name it quotes as code is a
    module of the core, or a class or function of one, or of ``Verifier`` (its method)."""
    core = {name.split(".", 1)[1] for name in modules() if name.startswith("core.")}
    defined = set()
    for module in core:
        tree = ast.parse((PACKAGE / "core" / f"{module}.py").read_text())
        defined |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    quoted = set(re.findall(r"``([\w.]+)``", importlib.import_module("ssd.core").__doc__))
    unknown = {q for q in quoted if q not in core and q.split(".")[-1] not in defined and q != "ssd.checks"
               and q != "ssd.clock"}
    assert not unknown, unknown
    assert core <= quoted, sorted(core - quoted)  # every module in the reading order
