"""The per-round record every decoding method returns, its pandas DataFrame, and the stopwatch that times it.

The stopwatch also keeps when each timed block ran (a Span: seconds since the call began), so a call can be drawn
as a timeline (``ssd.analysis.timeline.timeline``): the draft's steps and the target's passes taking turns in SD, the
pipeline's drafter pre-speculating while its verifier verifies."""
from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field

import pandas as pd

from .verify import target_token_role


@dataclass
class Round:
    """One round: the draft proposes draft_len tokens, the target verifies them in one pass.

    Autoregressive decoding is the degenerate case draft_len = 0: every round appends one target token.
    """

    draft_len: int  # K of this round (may be below the configured K near max_new_tokens)
    accepted: int  # k, drafted tokens accepted
    token: int  # t*, the token the target appended (recovered or bonus)
    new_tokens: int  # tokens this round added to the output (k + 1, less if EOS or max_new_tokens cut it)
    draft_s: float  # wall time of the draft phase
    verify_s: float  # wall time of the target pass and the accept/reject step
    # AR only: the target's largest logit and its lead over the second. A small margin is a near-tie, where another
    # way of computing the same logits (a pass over K + 1 tokens, a reduced precision) may pick the other token.
    top_logit: float | None = None
    margin: float | None = None


@dataclass
class SSDRound(Round):
    """A round of SSD: the draft phase is replaced by pre-speculation, plus a backup on a miss."""

    prespec_s: float = 0.0  # pre-speculating the next round for every predicted outcome (overlaps verify on 2 devices)
    hit: bool | None = None  # was this round's outcome (k, t*) in the cache? None where nothing was predicted
    rank: int | None = None  # rank of t* among the candidates at position k: a hit at fan-out F iff rank <= F
    fan_out: tuple[int, ...] = ()  # F_0..F_K the candidates of this round were chosen with
    budget: int | None = None  # B of this round: the sum of fan_out (with budget="auto", the tuner's choice)
    a_p: float | None = None  # the a_p and r the fan-out strategy used (calibrated: the running estimates)
    r: float | None = None
    backup: str | None = None  # which backup drafted the next round after a miss ("jit" or "fast")
    # Batch b: did every row of the batch that goes on hit this round? Only then is the round free of drafting
    # (about p_hit^b). Rows that finish this round take no part: they wait for no draft.
    all_hit: bool | None = None


@dataclass
class PipelineRound(SSDRound):
    """A round of the two-rank pipeline: verify_s on the verifier, prespec_s and draft_s on the drafter."""

    # The verifier's idle time from the end of this round's verify pass until the next draft (or the last report)
    # arrived: about max(0, prespec - verify) after a hit, plus the backup after a miss, plus the messages' transit.
    wait_s: float = 0.0


# The lane of a timeline each phase runs in: the target's (the pipeline's verifier, rank 0) or the draft's (its
# drafter, rank 1). "prefill_s", the prompts' pass apart from the rounds, is found only in traces stored before every
# method fed its prompts with the first round; it fed both models and is drawn on the target's lane.
LANES = {"prefill_s": "target", "verify_s": "target", "wait_s": "target", "draft_s": "draft", "prespec_s": "draft"}


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


@dataclass
class Trace:
    """Everything one generate call measured; the bench and the notebooks read only this."""

    method: str
    prompt_len: int
    rounds: list[Round] = field(default_factory=list)
    wall_s: float = 0.0  # whole call, prompt processing included
    # Of which the prompt's pass: fused with the first round (one target forward over the prompt and the first step
    # or draft, as transformers' generate makes it), whose time and tokens then count as the prompt's; in traces
    # stored before every method fused it, apart, before the first round. None: not measured.
    prefill_s: float | None = None
    prefill_tokens: int = 0  # new tokens out by the end of prefill_s (fused: the first round's; apart: none)
    # The sequences decoded together with this one (1: alone). A batch's rows share every forward, so each row's
    # wall_s, prefill_s and phase times are the batch's; tokens/s over a batch is its rows' tokens over one wall_s.
    batch_size: int = 1
    spans: list[Span] = field(default_factory=list)  # when each timed block ran (a batch's rows share them)
    # An engine that keeps its rounds to itself (llama.cpp's speculative tool, ssd.llamacpp.peers) reports only their
    # totals: drafted, accepted, rounds (target passes after the prompt's) and new_tokens. None: the rounds are here.
    reported: dict | None = None

    @property
    def decode_s(self) -> float | None:
        """Wall time after the prompt's pass: what decode tokens/s (the paper's measure) is over."""
        return self.wall_s - self.prefill_s if self.prefill_s is not None else None

    @property
    def new_tokens(self) -> int:
        return sum(r.new_tokens for r in self.rounds)

    @property
    def drafted(self) -> int:
        return sum(r.draft_len for r in self.rounds)

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted drafted tokens / drafted tokens: None where nothing was drafted (AR)."""
        drafted = self.drafted
        return sum(r.accepted for r in self.rounds) / drafted if drafted else None

    @property
    def mean_accepted(self) -> float | None:
        """Mean accepted count k over rounds that drafted something (the accepted-length histogram's mean)."""
        ks = [r.accepted for r in self.rounds if r.draft_len > 0]
        return sum(ks) / len(ks) if ks else None

    @property
    def hit_rate(self) -> float | None:
        """Hits over the lookups that count: every round's but the answer's last (see ``final_rounds``)."""
        return self._share_of_lookups("hit")

    @property
    def all_hit_rate(self) -> float | None:
        """At batch b: the share of this sequence's counted rounds in which every sequence that went on hit."""
        return self._share_of_lookups("all_hit")

    def _share_of_lookups(self, name: str) -> float | None:
        """The mean of a round's boolean `name` over every round but the last, whose lookup decides nothing."""
        known = [getattr(r, name) for r in self.rounds[:-1] if getattr(r, name, None) is not None]
        return sum(known) / len(known) if known else None

    @property
    def tokens_per_round(self) -> float | None:
        return self.new_tokens / len(self.rounds) if self.rounds else None

    def to_frame(self) -> pd.DataFrame:
        """One row per round, with the method and the round index: tidy, ready to concatenate across runs."""
        rows = [{"method": self.method, "round": i, **asdict(r)} for i, r in enumerate(self.rounds)]
        kind = type(self.rounds[0]) if self.rounds else Round
        return pd.DataFrame(rows, columns=["method", "round", *kind.__dataclass_fields__])

    def spans_frame(self) -> pd.DataFrame:
        """One row per timed block, for a timeline: method, round, phase, lane (target | draft), start_s, end_s, and
        the round's hit and backup where it has them (SSD)."""
        rounds = self.rounds
        rows = [{"method": self.method, "round": s.round, "phase": s.phase, "lane": LANES.get(s.phase, "target"),
                 "start_s": s.start_s, "end_s": s.end_s,
                 "hit": _of(rounds, s.round, "hit"), "backup": _of(rounds, s.round, "backup")} for s in self.spans]
        return pd.DataFrame(rows, columns=["method", "round", "phase", "lane", "start_s", "end_s", "hit", "backup"])


def final_rounds(rounds: pd.DataFrame) -> pd.Series:
    """Each answer's last round, in a frame that holds each answer's rounds together, in order, from round 0.

    Its lookup is moot: no round follows to use what it finds. And it misses more often than not (0.25-0.44 of
    stored runs' last rounds hit, against 0.74-0.98 of the others): its draft is cut to the room left, and with all
    of the cut draft accepted t* is most often the draft's own next token, which the cache leaves out as a
    rejected one. Counted, it biased hit rates low by 2-6 points on 64- to 128-token answers; every rate leaves it
    out."""
    after = rounds["round"].shift(-1)
    return after.isna() | after.eq(0)


def counted_lookups(rounds: pd.DataFrame) -> pd.DataFrame:
    """The rounds whose lookup counts in a hit rate: all but each answer's last (``final_rounds``)."""
    return rounds[~final_rounds(rounds)]


def _of(rounds: list[Round], i: int | None, name: str):
    """Round i's field `name`, or None (the prompts' pass, a round past the end, a method without the field)."""
    return getattr(rounds[i], name, None) if i is not None and 0 <= i < len(rounds) else None


def token_roles(rounds) -> list[str]:
    """The role of each new token, round by round: "accepted", or the target's token's role (``ssd.core.verify.ROLES``).

    A round adds new_tokens tokens: the first min(accepted, new_tokens) are accepted drafted tokens, then (if the
    round was not cut before it) the target's token t*. rounds: Trace.to_frame() or a Trace.
    """
    if hasattr(rounds, "to_frame"):
        rounds = rounds.to_frame()
    missing = [c for c in ("draft_len", "accepted", "new_tokens") if c not in rounds.columns]
    if missing:
        raise ValueError(f"token_roles needs the columns draft_len, accepted, new_tokens; missing {missing}")
    roles: list[str] = []
    for i, (d, k, n) in enumerate(zip(rounds["draft_len"], rounds["accepted"], rounds["new_tokens"])):
        d, k, n = int(d), int(k), int(n)
        if not (0 <= k <= d and 0 <= n <= k + 1):
            raise ValueError(f"round {i}: need 0 <= accepted <= draft_len and 0 <= new_tokens <= accepted + 1, "
                             f"got draft_len={d}, accepted={k}, new_tokens={n}")
        roles += ["accepted"] * min(k, n)
        if n > k:
            roles.append(target_token_role(k, d))
    return roles


class Stopwatch:
    """The phase times of a loop, kept out of its algorithm's lines:

        with watch("verify_s"):
            ...
        trace.rounds.append(Round(..., **watch.take()))   # the phases timed since the last take, by name

    Each timed block is also kept as a Span of the round in progress (take() ends a round), in seconds since
    `origin` (whole() sets it when the call begins; origin=0.0 keeps the clock's own readings, for a rank that
    sends its spans to another)."""

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

    def whole(self, *traces: Trace):
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
