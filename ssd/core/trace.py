"""The per-round record every decoding method returns, and the clock of a call nobody times.

Plain records: a loop appends one Round per round to each row's Trace. Its phase times are the clock's the caller
gave (``ssd.clock.Stopwatch``, which the bench and the exported methods give); without one (``Unclocked``) a round's
times are 0.0 and its trace's wall_s 0.0. Tables of them (pandas) are ``ssd.bench.frames``'."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field


@dataclass
class Round:
    """One round: the draft proposes draft_len tokens, the target verifies them in one pass.

    Autoregressive decoding is the degenerate case draft_len = 0: every round appends one target token.
    """

    draft_len: int  # K of this round (may be below the configured K near max_new_tokens)
    accepted: int  # k, drafted tokens accepted
    token: int  # t*, the token the target appended (recovered or bonus)
    new_tokens: int  # tokens this round added to the output (k + 1, less if EOS or max_new_tokens cut it)
    draft_s: float = 0.0  # wall time of the draft phase (0.0: untimed, or no draft)
    verify_s: float = 0.0  # wall time of the target pass and the accept/reject step (0.0: untimed)
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
    spans: list = field(default_factory=list)  # ssd.clock.Span: when each timed block ran (a batch's rows share them)
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


class Unclocked:
    """The clock of a call nobody times (the loops' default): every phase takes no time, no span is kept, and AR takes
    no near-tie margins. What the loops ask of a clock, which ``ssd.clock.Stopwatch`` answers with the time."""

    margins = False

    def __call__(self, phase: str):
        return contextlib.nullcontext()

    def side(self) -> "Unclocked":
        return self

    def take(self) -> dict[str, float]:
        return {}

    def before_rounds(self, phase: str):
        return contextlib.nullcontext()

    def spans_of(self, round_: int | None) -> tuple:
        return ()

    def add(self, spans, offset_s: float) -> None:
        pass

    def whole(self, *traces):
        return contextlib.nullcontext()
