"""The per-round record every decoding method returns, and its pandas DataFrame."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import pandas as pd


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
    a_p: float | None = None  # the a_p and r the fan-out strategy used (calibrated: the running estimates)
    r: float | None = None
    backup: str | None = None  # which backup drafted the next round after a miss ("jit" or "fast")


@dataclass
class PipelineRound(SSDRound):
    """A round of the two-rank pipeline: verify_s on the verifier, prespec_s and draft_s on the drafter."""

    # The verifier's idle time from the end of this round's verify pass until the next draft (or the last report)
    # arrived: about max(0, prespec - verify) after a hit, plus the backup after a miss, plus the messages' transit.
    wait_s: float = 0.0


@dataclass
class Trace:
    """Everything one generate call measured; the bench and the notebooks read only this."""

    method: str
    prompt_len: int
    rounds: list[Round] = field(default_factory=list)
    wall_s: float = 0.0  # whole call, prompt processing included
    prefill_s: float | None = None  # of which the prompt's pass before the first round (None: not measured apart)

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
        looked_up = [r.hit for r in self.rounds if getattr(r, "hit", None) is not None]
        return sum(looked_up) / len(looked_up) if looked_up else None

    @property
    def tokens_per_round(self) -> float | None:
        return self.new_tokens / len(self.rounds) if self.rounds else None

    def to_frame(self) -> pd.DataFrame:
        """One row per round, with the method and the round index: tidy, ready to concatenate across runs."""
        rows = [{"method": self.method, "round": i, **asdict(r)} for i, r in enumerate(self.rounds)]
        kind = type(self.rounds[0]) if self.rounds else Round
        return pd.DataFrame(rows, columns=["method", "round", *kind.__dataclass_fields__])
