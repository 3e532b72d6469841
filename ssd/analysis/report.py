"""One page per machine, generated from its folder of results (``python -m ssd report``): a settings line, a short
table of headline figures each with its 95% CI and the file it came from, and one summary figure. The README's
results table and docs/results.md come from the same pages, so no number a reader sees is typed by hand.

Which file a figure comes from is decided by the rules in ``pick`` and the figure functions below, never by a file's
name: among the folder's files at the machine's precision, greedy, the one that ran the figure's methods side by side
on the most prompts (the most batch sizes, for the batch study), then the newest. A figure no file holds says "not
measured": a page never carries another machine's number. Beside them, where the folder keeps such benches, a table of
the kit's fastest forwards (``FAST`` through compiled forwards), by the same rules.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from ..bench.stats import geometric_mean_ci, mean_ci, speedups
from ..bench.summaries import against_peers
from .batch_study import auto_over_fixed, break_even, by_batch_size, crossover
from ..names import ENGINE_AR
from .sources import BENCH, CALLS, HIT_RATES, UNKNOWN, Source, read_folder

NOT_MEASURED = "not measured"
SETS = {"humaneval": "HumanEval", "prose": "prose"}
PIPELINES = ("ssd-pipeline", "ssd-pipeline:auto")  # the pipeline as the command line runs it (backup on auto)
# The one convention of every ratio: per answer, run side by side, then the geometric mean over answers with its 95%
# Student-t interval (of the mean log ratio). The measure is named in each row's label: decode tokens/s (after the
# prompt's pass: the paper's measure) wherever both methods timed their prompt's pass, whole-call tokens/s against a
# peer that did not (transformers' generate).
MEASURES = {"decode_tokens_per_s": "decode tokens/s", "tokens_per_s": "whole-call tokens/s"}
NOTE = ("Ratios: per answer, of the measure the row names, run side by side; the geometric mean over answers [95% "
        "Student-t CI of the mean log ratio]. A break-even or crossover b is the first batch size measured at which it "
        "holds (no interval); the backup on auto: its range over the b measured, one run each.")
HIT_BUDGET = 4  # B of the hit-rate figure: the budget the pipeline's benches and the batch study run at
# The settings every pipeline figure is read at, like for like on every machine (the studies' B and fan-out; the
# command line's default is B 16 uniform): a file that ran others, or recorded none, is not read for them
PIPELINE_SETTINGS = {"budget": HIT_BUDGET, "fan_out": "calibrated"}
# The kit's fastest forwards, shown beside the eager ones at auto's precision (issue 56): both models at the GGUF's
# 4 bits through compiled forwards. Such a bench is read only where it records that no timed call made a graph
# (``graphs_made``): a compile inside the clock is not the forward's speed.
FAST = ("int4", "int4")
FAST_WORDS = "at int4 with compiled forwards"


@dataclass(frozen=True)
class Figure:
    """One row of a page's table. key: what it is, the same on every page ('sd/ar'); value and ci: the cell's text;
    sample: how many prompts (or batch sizes) it rests on; source: the file; mean/low/high and method: for the plot."""
    key: str
    what: str
    prompts: str
    value: str = NOT_MEASURED
    ci: str = ""
    sample: str = ""
    source: str = ""
    mean: float | None = None
    low: float | None = None
    high: float | None = None
    method: str | None = None

    @property
    def cell(self) -> str:
        return f"{self.value} {self.ci}".strip()


# ---- which source: the one rule every figure follows -------------------------------------------------------------

def pick(candidates: list[tuple[tuple, Source, object]]):
    """The candidate (size, source, payload) with the largest size (prompts paired, or batch sizes then rows), then
    the one of fewest methods, then the newest, then by name: a larger sample first; of two the same size, the run
    made for the comparison (a peers bench rather than the batch study that also ran the two, whose methods ran
    further apart in time), then the later run; a fixed order breaks ties, so the page is the same every time. None
    where there is none."""
    if not candidates:
        return None
    return max(candidates, key=lambda c: (c[0], -_breadth(c[1]), c[1].date, c[1].name))


def _breadth(source: Source) -> int:
    """How many methods (or fan-out strategies, in a hit-rate sweep) the source ran."""
    column = "method" if "method" in source.frame else "strategy"
    return source.frame[column].nunique() if column in source.frame else 0


def greedy(source: Source) -> bool:
    """Greedy, as recorded; a sweep that records no temperature ran greedy where it checked identity to the target
    (the kit checks identity only at temperature 0)."""
    t = source.settings.get("temperature")
    if t is not None:
        return float(t) == 0.0
    return "identical_to_target" in source.frame and source.frame["identical_to_target"].notna().any()


def at_b1(source: Source, prompts: str, precision) -> pd.DataFrame | None:
    """The source's rows of one prompt set at b = 1, where it is a greedy bench at `precision`; else None."""
    if source.kind != BENCH or source.precision != precision or not greedy(source):
        return None
    rows = source.frame
    rows = rows[(rows["prompts"] == prompts) & (rows["batch_size"] == 1) & rows["label"].notna()]
    return rows if len(rows) else None


# ---- the figures -------------------------------------------------------------------------------------------------

def ratio(sources, prompts, precision, key, what, over: tuple, under: tuple,
          measure: str = "decode_tokens_per_s", settings: dict | None = None) -> Figure:
    """A method's decode tokens/s over another's on the same answer, run side by side (paired within a run: a file,
    or a sweep point): the geometric mean over answers with its 95% CI (``stats.geometric_mean_ci``). settings: what
    a file must have run at to be read (the pipeline's B and fan-out), named in the label."""
    settings = settings or {}
    what = f"{what}{', ' + _setting_words(settings) if settings else ''}, by {MEASURES[measure]}"
    candidates = []
    for s in sources:
        rows = at_b1(s, prompts, precision)
        if rows is None or measure not in rows or not _at(s, settings):
            continue
        for a in over:
            for b in (b for b in under if {a, b} <= set(rows["label"])):
                both = rows[rows["label"].isin([a, b])].assign(method=rows["label"]).astype({measure: float})
                pairs = speedups(both, b, by="run", value=measure)
                pairs = pairs[pairs["method"] == a]
                if len(pairs):
                    candidates.append(((pairs["prompt_id"].nunique(),), s, (a, b, pairs)))
    best = pick(candidates)
    if best is None:
        return Figure(key, what, prompts)
    _, s, (a, b, pairs) = best
    ci = geometric_mean_ci(pairs["speedup"])
    setting = f"; {_pipeline_setting(s)}" if a.startswith("ssd") else ""
    return _numbers(key, what, prompts, ci, s, f"{int(ci['n'])} prompts{setting}", a, "x")


def peer(sources, prompts, precision, key, what, method: str, transformers: str) -> Figure:
    """Ours over transformers' method doing the same job, on the same answers: the geometric mean of the per-answer
    ratios of whole-call tokens/s with its 95% CI (``summaries.against_peers``)."""
    what = f"{what}, by {MEASURES['tokens_per_s']}"
    candidates = []
    for s in sources:
        rows = at_b1(s, prompts, precision)
        if rows is None or not {method, transformers} <= set(rows["label"]):
            continue
        # the whole call's ratio only: a peer that timed no prompt pass has no decode rate to pair
        both = rows[rows["label"].isin([method, transformers])].assign(method=rows["label"])
        both = both.drop(columns=["decode_tokens_per_s"], errors="ignore")
        found = [r for r in against_peers(both) if r["method"] == method and r["measure"] == "tokens_per_s"]
        if found:
            candidates.append(((found[0]["answers"],), s, found[0]))
    best = pick(candidates)
    if best is None:
        return Figure(key, what, prompts)
    _, s, r = best
    ci = {"mean": r["geometric_mean"], "ci_low": (r["ci"] or [math.nan])[0], "ci_high": (r["ci"] or [0, math.nan])[1]}
    return _numbers(key, what, prompts, ci, s, f"{r['answers']} prompts", method, "x")


def hit_rate(sources, prompts, precision, fan_out: str) -> Figure:
    """The pipeline's (or SSD's) hit rate at B = HIT_BUDGET with this fan-out, greedy (as every figure of the table),
    mean over prompts with its 95% CI (clipped to [0, 1]): from a bench at the machine's precision, or from a
    hit-rate sweep (``python -m ssd hit-rates``), which reads every B off one run but records no precision; the
    sample says which."""
    key, what = f"hit/{fan_out}", f"hit rate at B = {HIT_BUDGET}, {fan_out} fan-out, greedy"
    candidates = []
    for s in sources:
        if not greedy(s):  # a sampled sweep's hits are another figure: T moves the outcomes the cache must predict
            continue
        rows = _hit_rows(s, prompts, precision, fan_out)
        if rows is not None and len(rows):
            candidates.append(((rows["prompt_id"].nunique(),), s, rows))
    best = pick(candidates)
    if best is None:
        return Figure(key, what, prompts)
    _, s, rows = best
    per_prompt = rows.groupby("prompt_id", sort=True)["hit_rate"].mean().reset_index().assign(all=0)
    ci = mean_ci(per_prompt, "all", "hit_rate").iloc[0]
    setting = ", precision not recorded" if s.kind == HIT_RATES else ""
    return _numbers(key, what, prompts, ci, s, f"{int(ci['n'])} prompts{setting}", "ssd-pipeline", "")


def _hit_rows(s: Source, prompts, precision, fan_out) -> pd.DataFrame | None:
    if s.kind == HIT_RATES:  # a sweep: every strategy at every B from one run per prompt
        f = s.frame
        return f[(f["prompts"] == prompts) & (f["strategy"] == fan_out) & (f["budget"] == HIT_BUDGET)]
    if not _at(s, {"budget": HIT_BUDGET, "fan_out": fan_out}):
        return None
    rows = at_b1(s, prompts, precision)
    if rows is None or "hit_rate" not in rows:
        return None
    rows = rows[rows["label"].str.startswith("ssd") & rows["hit_rate"].notna()]
    first = sorted(rows["label"].unique())[:1]  # one method's rows: the pipeline's backups do not share a sample
    return rows[rows["label"].isin(first)]


def identity(sources, prompts, precision, methods: tuple = (), key: str = "identity",
             what: str = "greedy output identical to AR (answers)") -> Figure:
    """Greedy identity: per method, the answers token-identical to the target alone (AR) over all, from the greedy
    bench that checked the most answers. Given `methods`, theirs alone: another engine's (llama.cpp's SD, held
    against that engine's AR, ``ssd.names.ENGINE_AR``), which the default row leaves out with that AR itself."""
    candidates = []
    for s in sources:
        rows = at_b1(s, prompts, precision)
        if rows is None or "identical_to_target" not in rows:
            continue
        shown = rows["label"].isin(methods) if methods else ~rows["label"].isin(("ar", *ENGINE_AR))
        rows = rows[rows["identical_to_target"].notna() & shown]
        if len(rows):
            candidates.append(((len(rows),), s, rows))
    best = pick(candidates)
    if best is None:
        return Figure(key, what, prompts)
    _, s, rows = best
    counts = rows.groupby("label", sort=True)["identical_to_target"].agg(lambda v: (int(v.astype(bool).sum()), len(v)))
    value = ", ".join(f"{label} {same}/{n}" for label, (same, n) in counts.items()) + _near_ties(rows)
    return Figure(key, what, prompts, value, "", f"{rows['prompt_id'].nunique()} prompts", s.name)


def _near_ties(rows) -> str:
    """What the answers that left AR's tokens have in common, at a reduced precision: each first difference at a
    near-tie of the target's top two logits (the bench locates it, ``ssd.bench.lossless``), or how many were not."""
    differ = rows[~rows["identical_to_target"].astype(bool)]
    if differ.empty or "near_tie" not in differ:
        return ""
    if differ["near_tie"].isna().all() and differ["margin_at_difference"].notna().all():
        # an engine whose rounding the bench states no bound for (llama.cpp: its drift is measured apart, notebook 09)
        return f" (the rest where its AR's top-2 margin is <= {differ['margin_at_difference'].max():.2g})"
    ties = differ["near_tie"].fillna(False).astype(bool)
    if ties.all():
        return f" (the rest at near-ties, margin <= {differ['margin_at_difference'].max():.2g})"
    return f" ({int((~ties).sum())} not at a near-tie)"


def batch_figures(sources, prompts, precision) -> list[Figure]:
    """The batch-size study's figures (``batch_study``): SD's and the pipeline's break-even b against batched AR in
    total tokens/s, the crossover b* of the two backups, the backup on auto over the better fixed one."""
    tables = [(s, by_batch_size(s.frame[s.frame["prompts"] == prompts])) for s in sources
              if s.kind == CALLS and s.precision == precision and (s.frame["prompts"] == prompts).any()]
    # The pipeline's rows, like its ratio rows, read only a study run at PIPELINE_SETTINGS: its B and fan-out move
    # its speed, and so the batch sizes it breaks even and crosses over at.
    piped = [(s, t) for s, t in tables if _at(s, PIPELINE_SETTINGS)]
    at = f", {_setting_words(PIPELINE_SETTINGS)}"
    return [_batch(tables, prompts, "b/sd", "SD's break-even b against batched AR", lambda t: {"sd", "ar"},
                   lambda t: _break_even(t, "sd")),
            _batch(piped, prompts, "b/pipeline", f"the pipeline's break-even b against batched AR{at}",
                   lambda t: {_pipeline(t), "ar"}, lambda t: _break_even(t, _pipeline(t))),
            _batch(piped, prompts, "b/star", f"the backups' crossover b* (fast reaches jit){at}",
                   lambda t: {"ssd-pipeline:jit", "ssd-pipeline:fast"}, _crossover),
            _batch(piped, prompts, "b/auto",
                   f"the backup on auto over the better fixed one{at}, by the batch's decode tokens/s",
                   lambda t: {"ssd-pipeline:jit", "ssd-pipeline:fast", "ssd-pipeline:auto"}, _auto)]


def _at(s: Source, settings: dict) -> bool:
    """Whether the source ran at these settings (each recorded and equal)."""
    return all(s.settings.get(k) == v for k, v in settings.items())


def _pipeline(t: pd.DataFrame) -> str | None:
    """The pipeline as the command line runs it, in this table: by its plain name, else with its backup on auto
    (the name a study that also ran the fixed backups gave it); None where neither ran."""
    return next((p for p in PIPELINES if p in set(t["label"])), None)


def _batch(tables, prompts, key, what, needs, value) -> Figure:
    """The batch figure `value(table)` from the table, among those holding the methods `needs(table)` at two batch
    sizes or more, that ran the most batch sizes (``pick``)."""
    candidates = [((t["batch_size"].nunique(), len(t)), s, t) for s, t in tables
                  if needs(t) <= set(t["label"]) and t["batch_size"].nunique() > 1]
    best = pick(candidates)
    if best is None:
        return Figure(key, what, prompts)
    _, s, t = best
    sizes = sorted(t["batch_size"].unique())
    # a batch size has no interval, and the batch study ran each b once: these cells carry none (the page says so)
    sample = f"b = {', '.join(map(str, sizes))}" + ("" if key == "b/sd" else f"; {_pipeline_setting(s)}")
    return Figure(key, what, prompts, value(t), "", sample, s.name)


def _setting_words(settings: dict) -> str:
    """{"budget": 4, "fan_out": "calibrated"} -> 'B 4, calibrated fan-out'."""
    return f"B {settings['budget']}, {settings['fan_out']} fan-out"


def _pipeline_setting(s: Source) -> str:
    """The pipeline's B and fan-out in a source, which its speed depends on (the studies ran B 4 calibrated, the
    command line's default is B 16 uniform)."""
    budget, fan_out = s.settings.get("budget"), s.settings.get("fan_out")
    if budget is None and not fan_out:
        return "B, fan-out not recorded"
    return f"B {budget if budget is not None else 'not recorded'}, {fan_out or 'not recorded'} fan-out"


def _break_even(t: pd.DataFrame, method: str) -> str:
    b = break_even(t, method, "ar")["tokens_per_s"]
    return f"b = {b}" if b is not None else f"beyond b = {t['batch_size'].max()}"


def _crossover(t: pd.DataFrame) -> str:
    """b* measured and predicted, each over the batch sizes it covers: "none up to b = 16" where it is not reached,
    "not predicted" where fewer than two b carry a prediction of both backups (a bench predicts at b = 1 only)."""
    found = crossover(t)
    both = t[t["label"].isin(["ssd-pipeline:jit", "ssd-pipeline:fast"])]
    predicted_at = both.dropna(subset=["predicted"]).groupby("batch_size")["label"].nunique() if (
        "predicted" in both) else pd.Series(dtype=int)
    predicted_at = sorted(predicted_at[predicted_at == 2].index)
    top = t["batch_size"].max()
    measured = f"b = {found['measured']}" if found["measured"] is not None else f"none up to b = {top}"
    if len(predicted_at) < 2:
        return f"{measured} (not predicted)"
    predicted = f"b = {found['predicted']}" if found["predicted"] is not None else f"none up to b = {predicted_at[-1]}"
    return f"{measured} (predicted {predicted})"


def _auto(t: pd.DataFrame) -> str:
    ratios = auto_over_fixed(t)["auto_over_better"].dropna()
    return f"{ratios.min():.2f}x to {ratios.max():.2f}x" if len(ratios) else NOT_MEASURED


def _numbers(key, what, prompts, ci, s: Source, sample, method, unit) -> Figure:
    mean, low, high = (float(ci[c]) for c in ("mean", "ci_low", "ci_high"))
    interval = "(no interval: fewer than 3 prompts)" if math.isnan(low) else f"[{low:.2f}, {high:.2f}]"
    return Figure(key, what, prompts, f"{mean:.2f}{unit}", interval, sample, s.name, mean,
                  None if math.isnan(low) else low, None if math.isnan(high) else high, method)


# ---- one machine's figures ---------------------------------------------------------------------------------------

def held_sets(sources: list[Source]) -> list[str]:
    """The prompt sets (HumanEval, prose) the folder's files hold, in SETS' order."""
    return sorted({p for s in sources for p in s.frame.get("prompts", pd.Series(dtype=str)).unique() if p in SETS},
                  key=list(SETS).index)


def figures(sources: list[Source], precision, gpu: bool = False) -> list[Figure]:
    """Every headline figure of one folder at one precision, per prompt set the folder holds (HumanEval, prose). A
    GPU's page (``make gpu-check``'s benches) holds the few its record has: ours against transformers, identity."""
    out = []
    for p in held_sets(sources):
        out += [ratio(sources, p, precision, "sd/ar", "SD over AR", ("sd",), ("ar",))]
        if not gpu:
            out += [ratio(sources, p, precision, "pipeline/sd-1core", "the pipeline over SD on one core (sd-1core)",
                          PIPELINES, ("sd-1core",), settings=PIPELINE_SETTINGS),
                    ratio(sources, p, precision, "pipeline/sd", "the pipeline over SD on both cores", PIPELINES,
                          ("sd",), settings=PIPELINE_SETTINGS)]
        out += [peer(sources, p, precision, "ar/hf-ar", "our AR over transformers' generate", "ar", "hf-ar"),
                peer(sources, p, precision, "sd/hf-sd", "our SD over assisted generation", "sd", "hf-sd")]
        if not gpu:
            out += [hit_rate(sources, p, precision, "calibrated"), hit_rate(sources, p, precision, "uniform")]
            out += batch_figures(sources, p, precision)
        if not gpu:  # llama.cpp beside the kit, on the same GGUF files (make llamacpp)
            out += [ratio(sources, p, precision, "llamacpp-ar/ar", "llama.cpp's AR over ours (its own Q4_K_M target)",
                          ("llamacpp-ar",), ("ar",)),
                    ratio(sources, p, precision, "llamacpp-sd/llamacpp-ar", "llama.cpp's SD over its AR",
                          ("llamacpp-sd",), ("llamacpp-ar",))]
        out += [identity(sources, p, precision)]
        if not gpu:
            out += [identity(sources, p, precision, ("llamacpp-sd",), "llamacpp-identity",
                             "llama.cpp's SD identical to its AR (answers)")]
    return out


def compiled_sources(sources: list[Source]) -> list[Source]:
    """The benches at FAST through compiled forwards that record graphs_made, each with only its rows whose timed
    call made no graph."""
    return [replace(s, frame=s.frame[s.frame["graphs_made"].fillna(0) == 0]) for s in sources
            if s.kind == BENCH and s.forward == "compiled" and s.precision == FAST and "graphs_made" in s.frame]


def compiled_figures(sources: list[Source]) -> list[Figure]:
    """The fastest forwards' figures (FAST, compiled) per prompt set: SD over AR, our SD over llama.cpp's AR on the
    same GGUF files, and greedy identity; [] where no such bench is stored."""
    fast = compiled_sources(sources)
    out = []
    for p in held_sets(fast):
        out += [ratio(fast, p, FAST, "compiled:sd/ar", f"{FAST_WORDS}: SD over AR", ("sd",), ("ar",)),
                ratio(fast, p, FAST, "compiled:sd/llamacpp-ar",
                      f"{FAST_WORDS}: our SD over llama.cpp's AR (its own Q4_K_M target)", ("sd",), ("llamacpp-ar",)),
                identity(fast, p, FAST, key="compiled:identity",
                         what=f"{FAST_WORDS}: greedy output identical to AR (answers)")]
    return out


def precisions(sources: list[Source]) -> list[tuple[str, str]]:
    """The precisions a page shows: the one auto picked on the machine (the most benches' where several); where no
    bench ran on auto (a gpu-check record asks for each), every precision a bench ran at."""
    benches = [s for s in sources if s.kind == BENCH and UNKNOWN not in s.precision and None not in s.precision]
    auto = pd.Series([s.precision for s in benches if s.auto], dtype=object)
    if len(auto):
        counts = auto.value_counts()
        return [sorted(counts[counts == counts.max()].index)[0]]
    return sorted({s.precision for s in benches})


# ---- the page ----------------------------------------------------------------------------------------------------

@dataclass
class Page:
    machine: str
    words: str  # the machine in words (``machines.describe``)
    precisions: list
    figures: dict  # precision -> [Figure]
    sources: list
    compiled: list = field(default_factory=list)  # the fastest forwards' [Figure] (FAST, compiled), where stored

    def used(self) -> list[Source]:
        names = {f.source for fs in [*self.figures.values(), self.compiled] for f in fs}
        return [s for s in self.sources if s.name in names]


def page(folder: str, machine: str | None = None, words: str | None = None) -> Page:
    """The page of one machine's folder of results (data/<machine>/, or a user's runs/.../<machine>/)."""
    sources = read_folder(folder)
    if not sources:
        raise ValueError(f"folder must hold bench JSONs or sweep CSVs, got {folder!r} with none")
    machine = machine or os.path.basename(os.path.normpath(folder))
    gpu = any(s.name.startswith("gpu_") and "#" in s.name for s in sources)
    chosen = precisions(sources)
    return Page(machine, words or machine, chosen, {p: figures(sources, p, gpu) for p in chosen}, sources,
                [] if gpu else compiled_figures(sources))


def settings_line(pg: Page) -> str:
    """The machine, cores, precisions, pair, K, prompts x tokens, and each file used with its date and commit; a
    setting no file used records is named as not recorded."""
    used = sorted({s.name.split("#")[0]: s for s in pg.used()}.items())

    def values(key):
        return ", ".join(sorted({str(s.settings.get(key)) for _, s in used if s.settings.get(key) is not None}))

    gpu = values("device") if "NVIDIA" in values("device") or "AMD Instinct" in values("device") else ""
    cores = values("cores")
    head = f"**{pg.words}**" + (f" ({cores} cores)" if cores and not gpu else f" (host: {cores} CPU cores)"
                                if cores else "")
    shown = [f"target {t}, draft {d}" for t, d in pg.precisions]
    shown += [f"target {FAST[0]}, draft {FAST[1]}, compiled forwards"] if _measured(pg.compiled) else []
    parts = [head, "; ".join(shown)]
    named = {"pair": "pair {}", "k": "K {}", "max_new_tokens": "{} new tokens a prompt"}
    parts += [form.format(values(key)) for key, form in named.items() if values(key)]
    missing = [{"k": "K", "max_new_tokens": "tokens"}.get(key, key) for key in named if not values(key)]
    parts += [f"{', '.join(missing)} not recorded in the files"] if missing else []
    files = "; ".join(f"`{name}` ({s.date}, {s.commit})" for name, s in used) or "none"
    return " · ".join([*parts, "greedy unless a row says otherwise", f"files: {files}"])


def markdown(pg: Page, figure_path: str | None = None, heading: str = "##", lead: str = "") -> str:
    """The page as markdown: heading, lead (what the page found, ``ssd.analysis.verdicts``), settings line, one table
    per precision shown, the figure."""
    lines = [f"{heading} {pg.machine}", "", *([lead, ""] if lead else []), settings_line(pg), ""]
    for precision in pg.precisions:
        if len(pg.precisions) > 1:
            lines += [f"At target {precision[0]}, draft {precision[1]}:", ""]
        lines += _table(pg.figures[precision])
    if _measured(pg.compiled):
        lines += [f"At target {FAST[0]}, draft {FAST[1]}, compiled forwards (`--forward compiled`; a bench counts "
                  "where it records that no timed call made a graph):", "", *_table(pg.compiled)]
    lines += [NOTE, ""]
    if figure_path:
        lines += [f"![{pg.machine}: the headline ratios with their 95% CIs]({figure_path})", ""]
    return "\n".join(lines)


def _measured(shown: list[Figure]) -> bool:
    return any(f.value != NOT_MEASURED for f in shown)


def _table(shown: list[Figure]) -> list[str]:
    lines = ["| figure | prompts | value [95% CI] | sample | file |", "|---|---|---|---|---|"]
    lines += [f"| {f.what} | {SETS[f.prompts]} | {f.cell} | {f.sample or '-'} | "
              f"{'`' + f.source + '`' if f.source else '-'} |" for f in shown]
    return [*lines, ""]


def plot(pg: Page, path: str) -> str:
    """The page's ratios as points with their 95% CIs on a log axis (ratios multiply: 2x and 0.5x lie as far from 1),
    a line at 1, one colour per method; captioned with the machine and precision; saved as a PNG at `path`."""
    import matplotlib.pyplot as plt

    from . import style

    shown = [f for f in pg.figures[pg.precisions[0]] if f.mean is not None and f.value.endswith("x")]
    if not shown:
        raise ValueError(f"the page of {pg.machine} has no ratio to draw")
    colours = style.method_colours([f.method for f in shown])
    with style.styled():
        fig, ax = plt.subplots(figsize=(10.0, 0.42 * len(shown) + 1.4))
        y = np.arange(len(shown))[::-1]
        for yi, f in zip(y, shown):
            err = None if f.low is None else [[f.mean - f.low], [f.high - f.mean]]
            ax.errorbar(f.mean, yi, xerr=err, fmt="o", color=colours[f.method], capsize=3, markersize=6)
        ax.axvline(1.0, color="0.2", linewidth=1)
        ax.set_xscale("log")
        lows = [f.low or f.mean for f in shown] + [1.0]
        highs = [f.high or f.mean for f in shown] + [1.0]
        ticks = [2.0**e for e in range(-6, 7) if min(lows) / 1.5 <= 2.0**e <= max(highs) * 1.5]
        ax.set_xticks(ticks, [f"{t:g}x" for t in ticks])
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_yticks(y, [f"{f.what}, {SETS[f.prompts]}" for f in shown], fontsize="small")
        ax.set_xlabel("ratio (log scale): geometric mean over answers, 95% CI"
                      + ("" if all(f.low is not None for f in shown) else " (no error bar: fewer than 3)"))
        target, draft = pg.precisions[0]
        fig.tight_layout()  # the axis label inside the figure, so that the caption below it clears it
        style.caption(fig, style.setting_line(pg.words, target, draft))
        out = style.save(fig, path)
        plt.close(fig)
    return out
