"""Measurement, kept out of the algorithm: the stopwatch a caller hands a decoding loop to time its phases, and the
clock that times every forward of a model, whoever calls it.

A loop of ``ssd.core`` times nothing itself: it marks its phases on the clock it is given (``clock("verify_s")``,
``clock.take()`` once a round), and a call nobody times is given ``ssd.core.trace.Unclocked``, whose phases take no
time. The stopwatch also keeps when each timed block ran (a Span: seconds since the call began), so a call can be drawn
as a timeline (``ssd.analysis.timeline.timeline``): the draft's steps and the target's passes taking turns in SD, the
pipeline's drafter pre-speculating while its verifier verifies. A leaf: it imports neither torch nor the package, so
every layer that measures (the pipeline's ranks, the bench) can hold one.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    """One timed block of a generate call: a phase (a Round's time field, or in older traces "prefill_s" for the
    prompts' pass) of a round (None: before the first, as the pipeline drafter's first drafts), from start_s to
    end_s in seconds since the call began, on this host's monotonic clock (time.perf_counter: one clock for every
    process of a host, so both ranks of a local pipeline share it)."""

    round: int | None
    phase: str
    start_s: float
    end_s: float


class Stopwatch:
    """The phase times of a loop, kept out of its algorithm's lines:

        with watch("verify_s"):
            ...
        trace.rounds.append(Round(..., **watch.take()))   # the phases timed since the last take, by name

    Each timed block is also kept as a Span of the round in progress (take() ends a round), in seconds since
    `origin` (whole() sets it when the call begins; origin=0.0 keeps the clock's own readings, for a rank that
    sends its spans to another)."""

    margins = True  # a timed call is a measured one: AR keeps its near-tie margins too (ssd.core.decoding)

    def __init__(self, origin: float | None = None):
        self.seconds: dict[str, float] = {}
        self.spans: list[Span] = []
        self.origin = time.perf_counter() if origin is None else origin
        self.round = 0

    def __call__(self, phase: str):
        """Add the time of the block to `phase`, and keep when it ran."""
        return _timed(lambda start, end: self._record(phase, start, end))

    def _record(self, phase: str, start: float, end: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + (end - start)
        self.spans.append(Span(self.round, phase, start - self.origin, end - self.origin))

    def side(self) -> "Stopwatch":
        """A stopwatch for the drafter's side of SSD's round, on its clock's own readings (origin 0.0): its spans
        travel with its reports to this one (``add``), as they would from another process."""
        return Stopwatch(origin=0.0)

    def take(self) -> dict[str, float]:
        """The times since the last take, by phase, and start afresh: the next blocks belong to the next round."""
        taken, self.seconds = self.seconds, {}
        self.round += 1
        return taken

    def before_rounds(self, phase: str):
        """Time a block that comes before the first round and belongs to none (the pipeline drafter's prompt pass and
        first drafts): a span of round None, in no round's times."""
        return _timed(lambda start, end: self.spans.append(Span(None, phase, start - self.origin, end - self.origin)))

    def spans_of(self, round_: int | None) -> tuple[Span, ...]:
        return tuple(s for s in self.spans if s.round == round_)

    def add(self, spans, offset_s: float) -> None:
        """Keep another rank's spans (timed with origin 0.0 on its clock, its rounds numbered as this one's), shifted
        onto this one: offset_s is its clock minus this one (0 on one host; see ssd.pipeline.protocol.clock_offset
        across hosts). The spans stay in the order they began, as if one stopwatch had timed both."""
        shift = offset_s + self.origin
        shifted = [Span(s.round, s.phase, s.start_s - shift, s.end_s - shift) for s in spans]
        self.spans = sorted(self.spans + shifted, key=lambda s: s.start_s)

    def whole(self, *traces):
        """Time a whole generate call into each trace's wall_s, and give each the call's spans (a batch's rows share
        them); the call's clock starts here. Every method feeds the target its prompts with the first round's verify
        pass (one target forward fewer, as transformers' generate makes it), so the first round counts as the
        prompts' pass: each trace's prefill_s ends with that pass, and the round's tokens are its prefill_tokens."""
        self.origin, self.spans, self.round = time.perf_counter(), [], 0

        def record(start: float, end: float) -> None:
            first = [s.end_s for s in self.spans if s.round == 0 and s.phase == "verify_s"]
            for trace in traces:
                trace.wall_s, trace.spans = end - start, list(self.spans)
                if first and trace.rounds:
                    trace.prefill_s, trace.prefill_tokens = max(first), trace.rounds[0].new_tokens

        return _timed(record)


@contextlib.contextmanager
def _timed(record):
    start = time.perf_counter()
    try:
        yield
    finally:
        record(start, time.perf_counter())


class ForwardClock:
    """Counts and times every forward of some models, whoever calls them: our loops or transformers' generate. So a
    call's wall time splits into the target's forwards, the draft's, and everything outside them (sampling,
    verification, cache bookkeeping, Python), for our methods and the peers alike:

        with ForwardClock(target=pair.target, draft=pair.draft) as clock:
            generate(...)
        clock.seconds["target"], clock.calls["draft"], clock.first_s["target"]  # the first: the prompt's pass

    Hooks sit on each model and on its body (``base_model``: a pass that needs no logits, as CachedModel.extend
    makes, calls only the body); a call inside another of the same model is part of it, not a forward of its own.
    """

    def __init__(self, **models):
        self.models = models
        self.seconds = dict.fromkeys(models, 0.0)
        self.calls = dict.fromkeys(models, 0)
        self.first_s: dict[str, float | None] = dict.fromkeys(models)
        self._hooks: list = []
        self._depth = dict.fromkeys(models, 0)
        self._started = dict.fromkeys(models, 0.0)

    def __enter__(self):
        for name, model in self.models.items():
            for module in {id(m): m for m in (model, getattr(model, "base_model", model))}.values():
                self._hooks.append(module.register_forward_pre_hook(lambda *_, name=name: self._start(name)))
                self._hooks.append(module.register_forward_hook(lambda *_, name=name: self._stop(name)))
        return self

    def __exit__(self, *exc):
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def _start(self, name: str) -> None:
        self._depth[name] += 1
        if self._depth[name] == 1:
            self._started[name] = time.perf_counter()

    def _stop(self, name: str) -> None:
        self._depth[name] -= 1
        if self._depth[name]:
            return
        seconds = time.perf_counter() - self._started[name]
        self.seconds[name] += seconds
        self.calls[name] += 1
        if self.first_s[name] is None:
            self.first_s[name] = seconds
