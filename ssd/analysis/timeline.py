"""The timeline: generate calls on one time axis, one lane per model (the pipeline's: per rank), each timed block a
bar coloured by its phase, each SSD round marked hit or miss. The course's central picture (notebook 05): who works
when, and what the overlap of drafting and verifying buys."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from ..bench.frames import spans_frame
from ..core.trace import Trace
from .style import check_frame, ordered, styled

# The timeline's phases (ssd.clock.Span) and their colours; a drafted round's draft_s is the draft model's steps in
# SD, the lookup (a hit) or the backup (a miss) in SSD.
PHASE_COLOURS = {"prompts' pass": "#bdbdbd", "verify": "#3b75af", "wait": "#ececec", "draft steps": "#ef8636",
                 "pre-speculation": "#8e6cc0", "lookup": "#55a868", "backup (jit)": "#c44e52",
                 "backup (fast)": "#e3a0a3"}


# --- the timeline (notebook 05) ------------------------------------------------------------------------------------

LANE_NAMES = {"ssd-pipeline": {"target": "verifier (rank 0)", "draft": "drafter (rank 1)"}}


def timeline_spans(traces) -> pd.DataFrame:
    """The spans frame `timeline` draws: a frame already (``spans_frame``'s columns), a Trace, or a list of
    Traces (one call each)."""
    if isinstance(traces, pd.DataFrame):
        return traces
    traces = [traces] if isinstance(traces, Trace) else list(traces)
    return pd.concat([spans_frame(t) for t in traces], ignore_index=True)


def _phase_name(phase: str, hit, backup) -> str:
    """What a span is called (and coloured) on the timeline."""
    if phase == "draft_s":
        if isinstance(backup, str):
            return f"backup ({backup})"
        return "draft steps" if hit is None or pd.isna(hit) else "lookup"
    return {"prefill_s": "prompts' pass", "verify_s": "verify", "wait_s": "wait",
            "prespec_s": "pre-speculation"}.get(phase, phase)


def timeline(traces, rounds: int | None = None, title: str = ""):
    """Generate calls on one time axis (seconds since each call began): one lane per model of each method (the
    pipeline's: per rank), its timed blocks as bars coloured by phase (PHASE_COLOURS): the prompts' pass, the
    target's verify passes and the verifier's waits; the draft's steps (SD), or the drafter's pre-speculation and,
    after each round's outcome, its lookup (a hit) or backup (a miss). Each SSD round's verify pass but the last
    (whose lookup decides nothing) is marked above with its hit (a green triangle) or miss (a red cross). rounds:
    draw only the prompts' pass and the first `rounds` rounds. traces: a Trace, a list of them (one call per
    method), or a frame of spans (``spans_frame``, several methods' concatenated; ssd.bench.run.run_bench's "spans"
    for one prompt)."""
    frame = check_frame(timeline_spans(traces),
                        ["method", "round", "phase", "lane", "start_s", "end_s", "hit", "backup"], "timeline")
    # The last round's lookup decides nothing (trace.final_rounds): no mark for it
    frame = frame.assign(mark=frame["phase"].eq("verify_s") & frame["hit"].isin([True, False])
                         & (frame["round"] < frame.groupby("method")["round"].transform("max")))
    if rounds is not None:
        if rounds < 1:
            raise ValueError(f"rounds must be at least 1 (or None for every round), got {rounds}")
        frame = frame[frame["round"].isna() | (frame["round"] < rounds)]
    methods = [str(m) for m in ordered(frame["method"])]
    lanes = [(m, lane) for m in methods for lane in ("draft", "target") if ((frame["method"] == m)
                                                                            & (frame["lane"] == lane)).any()]
    with styled():
        fig, ax = plt.subplots(figsize=(12.0, 0.55 * len(lanes) + 1.6))
        for y, (method, lane) in enumerate(reversed(lanes)):
            spans = frame[(frame["method"] == method) & (frame["lane"] == lane)]
            for s in spans.itertuples():
                name = _phase_name(s.phase, s.hit, s.backup)
                ax.broken_barh([(s.start_s, s.end_s - s.start_s)], (y - 0.38, 0.76), facecolors=PHASE_COLOURS.get(
                    name, "black"), edgecolor="white", linewidth=0.5)
                if s.mark:
                    ax.plot(s.end_s, y + 0.5, "^" if s.hit else "x", color="#2a9d3f" if s.hit else "#c44e52",
                            markersize=7, markeredgewidth=2)
        ax.set_yticks(range(len(lanes)))
        ax.set_yticklabels([f"{m}: {LANE_NAMES.get(m, {}).get(lane, lane)}" for m, lane in reversed(lanes)])
        ax.set_ylim(-0.6, len(lanes) - 0.2)
        ax.set_xlim(left=0)
        ax.set(xlabel="seconds since the call began")
        ax.grid(axis="y", visible=False)
        shown = {_phase_name(p, h, b) for p, h, b in zip(frame["phase"], frame["hit"], frame["backup"])}
        handles = [plt.Rectangle((0, 0), 1, 1, facecolor=c, edgecolor="0.6", linewidth=0.5, label=name)
                   for name, c in PHASE_COLOURS.items() if name in shown]
        marked = frame.loc[frame["mark"], "hit"]
        if marked.isin([True]).any():
            handles.append(plt.Line2D([], [], marker="^", color="#2a9d3f", linestyle="", label="hit"))
        if marked.isin([False]).any():
            handles.append(plt.Line2D([], [], marker="x", color="#c44e52", linestyle="", markeredgewidth=2,
                                      label="miss"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
        ax.set_title(title or "Timeline: who works when", fontsize="medium")
        fig.tight_layout()
    return fig


