"""The pipeline's protocol: the messages the two ranks exchange, and how each rank runs one generate call.

The round itself is ``ssd.core.round``'s (its docstring draws the exchange), the one single-process SSD runs: rank 0
runs ``verify_rounds`` over ``Remote`` (the speculator behind the channel), rank 1 its drafter's side, ``draft_rounds``,
which answers it; this module only carries their messages, plus its own: Ready (rank 1 has loaded the draft),
Start (rank 0 opens a generate call: prompts, config, the generator's state), LastReports (the drafter's reports on
the last round, where no drafts follow) and Stop.

No random numbers cross: the verifier sends its generator's state with the Start message and each rank draws from
it through its own ``ssd.core.round.Draws``, which draws what generate_ssd draws, in its order; each rank uses its
share (the drafter the draft uniforms, the verifier the verify uniforms).

Clocks: each Report carries when the drafter's blocks ran, so the verifier's trace holds both ranks' spans on one
time axis (``ssd.analysis.timeline.timeline``). On one host both ranks read the same monotonic clock; across hosts the
drafter's clock is put on the verifier's by the offset estimated from the first exchange (``clock_offset``, NTP's
rule), good to about half the difference between the two directions' transit times.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass

import torch

from ..clock import Span, Stopwatch
from ..core.decoding import Verifier
from ..core.latencies import Profile
from ..core.round import DraftMessage, DrafterSide, Draws, Verdicts, Report, VerifierSide, verify_rounds
from ..core.speculation import SSDConfig, Speculator
from ..core.trace import SSDRound, Trace
from ..core.tuning import Autotune
from ..core.verify import Verdict
from ..models.cores import pinned
from .transport import Channel


@dataclass
class PipelineRound(SSDRound):
    """A round of the two-rank pipeline: verify_s on the verifier, prespec_s and draft_s on the drafter."""

    # The verifier's idle time from the end of this round's verify pass until the next draft (or the last report)
    # arrived: about max(0, prespec - verify) after a hit, plus the backup after a miss, plus the messages' transit.
    wait_s: float = 0.0


# ---- the messages --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Ready:
    """Rank 1 -> 0, once: the draft is loaded; where and how it runs."""

    vocab_size: int
    host: str
    pid: int
    device: str
    cores: list[int]
    threads: int
    precision: str
    forward: str = "eager"  # how its draft's forward runs (ssd.models.forwards): the verifier's pair's own


@dataclass(frozen=True, kw_only=True)
class Start:
    """Rank 0 -> 1: a generate call begins, over a batch of prompts (rows; b = 1: one)."""

    prompts: list[list[int]]
    config: SSDConfig
    generator_state: torch.Tensor  # the verifier's generator: both ranks draw the same stream
    rooms: list[int]  # per row: the most tokens its first round may draft (max_new_tokens - 1)
    vocab_size: int
    timeout_s: float
    sent_s: float  # the verifier's clock (time.perf_counter) as it sent this
    # The cores that the drafter's prompt pass, first drafts and round 0's pre-speculation take, and then the
    # verifier's round 0 (which feeds the target its prompts): both ranks', where they are this machine's, since each
    # rank waits idle for the other's first work (empty: each rank its own, overlapping as in every later round).
    first_cores: tuple[int, ...] = ()
    # On auto: the latencies at this call's batch size, which the drafter's tuners price their choices on (the
    # estimates they learn from are the drafter process's own, carried over its calls: ``serve``)
    latencies: Profile | None = None


@dataclass(frozen=True, kw_only=True)
class DrafterClock:
    """Rank 1 -> 0, once a call, right after round 0's drafts: this rank's clock (time.perf_counter) when the Start
    arrived and when those drafts left, for clock_offset."""

    received_s: float
    sent_s: float


@dataclass(frozen=True, kw_only=True)
class LastReports:
    """Rank 1 -> 0: the reports of the last round, once every row is done."""

    previous: dict[int, Report]


@dataclass(frozen=True, kw_only=True)
class Stop:
    """Rank 0 -> 1: no more generate calls."""


# ---- rank 1: the drafter -------------------------------------------------------------------------------------------


def serve(channel: Channel, draft_model) -> None:
    """Rank 1 once its draft is loaded: one generate call per Start message, until Stop. One Autotune for the
    process's life: a call on auto starts from the estimates the last one on its settings left."""
    autotune = Autotune()
    while True:
        start, _ = channel.recv(Start, Stop, timeout_s=None, doing="waiting for the next generate call")
        if isinstance(start, Stop):
            return
        speculate(channel, draft_model, start, time.perf_counter(), autotune)


def speculate(channel: Channel, draft_model, start: Start, received_s: float, autotune: Autotune) -> None:
    """Rank 1's side of one generate call: ssd.core.round's drafter side over the batch, its link to the verifier the
    channel. received_s: this rank's clock when the Start arrived; autotune: what a call on auto learns from (the
    drafter process's, carried over its calls), priced on the Start's latencies."""
    generator = torch.Generator()
    generator.set_state(start.generator_state)
    if start.latencies is not None:
        autotune.profiles[len(start.prompts)] = start.latencies
    speculator = Speculator(draft_model, start.prompts, start.config, start.vocab_size, autotune)
    drafter = DrafterSide(speculator, Draws(generator), Stopwatch(origin=0.0))
    # The verifier feeds its prompts with round 0's verify pass, on start.first_cores where it names them (the
    # drafter's too: this rank has nothing to do then). So on such shared cores this rank makes its prompts' pass,
    # its first drafts and round 0's pre-speculation before that verify pass, on both ranks' cores; with cores or a
    # device of its own it pre-speculates round 0 while round 0 is verified, like every later round.
    early = bool(start.first_cores)
    with pinned(list(start.first_cores)) if early else contextlib.nullcontext():
        with drafter.clock.before_rounds("draft_s"):  # sent with round 0's report
            drafter.start(start.prompts, dict(enumerate(start.rooms)))
        if early:
            drafter.prespeculate()  # round 0's pre-speculation, done: draft_rounds does not repeat it
    draft_rounds(drafter, channel, start.timeout_s, received_s, prespeculated=early)


def draft_rounds(drafter: DrafterSide, channel: Channel, timeout_s: float, received_s: float,
                 prespeculated: bool = False) -> None:
    """Rank 1's rounds, from its first drafts (``DrafterSide.start``) until every row is done: send a round's drafts
    (with the reports on the round before; round 0's followed by this rank's clock, for clock_offset), pre-speculate
    while rank 0 verifies them (round 0's unless done already: prespeculated), then follow its verdicts."""
    reports = None
    while drafter.live:
        message, q = drafter.message(reports)
        channel.send(message, q, timeout_s=timeout_s, doing=f"sending the drafts of round {message.round}")
        if message.round == 0:
            clock = DrafterClock(received_s=received_s, sent_s=time.perf_counter())
            channel.send(clock, timeout_s=timeout_s, doing="sending the drafter's clock")
        if message.round or not prespeculated:
            drafter.prespeculate()
        doing = f"waiting for the verdicts of round {message.round}"
        reports = drafter.follow(channel.recv(Verdicts, timeout_s=timeout_s, doing=doing)[0])
    channel.send(LastReports(previous=reports), timeout_s=timeout_s, doing="sending the last reports")


def clock_offset(sent_s: float, received_s: float, replied_s: float, answered_s: float) -> float:
    """The drafter's clock minus the verifier's, from one exchange (NTP's estimate): the Start left the verifier at
    sent_s and reached the drafter at received_s; the first drafts left at replied_s and arrived at answered_s. Exact
    when the two transits take equal times; off by half their difference otherwise."""
    return ((received_s - sent_s) + (replied_s - answered_s)) / 2


# ---- rank 0: the verifier ------------------------------------------------------------------------------------------


def verify_call(channel: Channel, verifier: Verifier, config: SSDConfig, generator: torch.Generator,
                vocab_size: int, timeout_s: float, traces: list[Trace], clock: Stopwatch, same_host: bool,
                first_cores: tuple[int, ...] = (), latencies: Profile | None = None) -> None:
    """Rank 0's side of one generate call: start the drafter, then run ``ssd.core.round.verify_rounds`` over it
    until every row is done, recording each row's rounds in its trace and both ranks' spans on the call's clock
    (same_host: the drafter reads this host's clock). Round 0's verify pass also feeds the target its prompts; it
    runs on first_cores where they are given (Start's: this rank's and the drafter's, which waits for its outcome).
    latencies: on auto, what the drafter's tuners price their choices on."""
    start = Start(prompts=verifier.tokens, config=ssd_settings(config), generator_state=generator.get_state(),
                  rooms=[verifier.room(row) for row in verifier.live], vocab_size=vocab_size, timeout_s=timeout_s,
                  sent_s=time.perf_counter(), first_cores=tuple(first_cores), latencies=latencies)
    channel.send(start, timeout_s=timeout_s, doing="sending the prompts")
    first = channel.recv(DraftMessage, timeout_s=timeout_s, doing="waiting for the first drafts")
    answered_s = time.perf_counter()
    drafter = channel.recv(DrafterClock, timeout_s=timeout_s, doing="waiting for the drafter's clock")[0]
    offset_s = 0.0 if same_host else clock_offset(start.sent_s, drafter.received_s, drafter.sent_s, answered_s)
    side = VerifierSide(verifier, Draws(generator), traces, clock, vocab_size, record=PipelineRound)
    verify_rounds(side, Remote(channel, first, timeout_s, clock, offset_s, first_cores))


class Remote:
    """The speculator on rank 1, as rank 0's ``verify_rounds`` drives it: its drafts arrive on the channel (each
    round's with the reports on the round before), it pre-speculates on its own while rank 0 verifies, and it answers
    the verdicts with the next drafts. The verifier's idle time until they arrive is the round's wait_s."""

    def __init__(self, channel: Channel, first: tuple[DraftMessage, torch.Tensor | None], timeout_s: float,
                 clock: Stopwatch, offset_s: float, first_cores: tuple[int, ...]):
        self.channel, self.next, self.timeout_s, self.clock = channel, first, timeout_s, clock
        self.offset_s, self.first_cores = offset_s, first_cores
        self.round = 0

    def drafts(self) -> tuple[DraftMessage, torch.Tensor | None]:
        return self.next

    def meanwhile(self):
        """Round 0 on the first cores where given (the drafter waits for its outcome then), later rounds as pinned."""
        return pinned(list(self.first_cores)) if self.round == 0 and self.first_cores else contextlib.nullcontext()

    def follow(self, verdicts: Verdicts) -> dict[int, Report]:
        last = all(verdicts.done.values())
        with self.clock("wait_s"):  # idle until the next drafts: max(0, prespec - verify) after hits, more after a miss
            self.channel.send(verdicts, timeout_s=self.timeout_s, doing=f"sending the verdicts of round {self.round}")
            doing = "waiting for the last reports" if last else f"waiting for the drafts of round {self.round + 1}"
            self.next = self.channel.recv(LastReports if last else DraftMessage, timeout_s=self.timeout_s, doing=doing)
        self.round += 1
        return self.next[0].previous  # what the drafter did while and after the round was verified


def ssd_settings(config: SSDConfig) -> SSDConfig:
    """The SSD settings alone (a PipelineConfig's cores and timeout are rank 0's business): what the Start carries."""
    return SSDConfig(**{f.name: getattr(config, f.name) for f in dataclasses.fields(SSDConfig)})


# Every dataclass that crosses, the messages and what they hold (Start's SSD settings and latency profile, the
# Verdicts, the Reports' Spans): ssd.pipeline.wire builds no other.
WIRE_TYPES = (Ready, Start, DraftMessage, DrafterClock, Verdicts, LastReports, Stop, Report, Verdict, Span, SSDConfig,
              Profile)
