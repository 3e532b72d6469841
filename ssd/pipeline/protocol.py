"""The pipeline's protocol: the messages the two ranks exchange, and each rank's loop over one generate call.

    drafter (rank 1)                                       verifier (rank 0)
    DraftMessage r: each row's x_1..x_K           ---->    verify drafts r: one target pass over all rows
      (+ q rows if T > 0)
    pre-speculate round r + 1 for every                    ...
      predicted outcome of every row (one tree)
                                                 <----     Outcome: each row's verdict (k, t*), done
    observe: a hit takes a row's draft r + 1 from
      its cache; the rows that missed are drafted
      by the backup together
    DraftMessage r + 1 (+ round r's Reports)      ---->

Both loops are ``ssd.core.speculation``'s: the drafter drives a Speculator (propose, prespeculate, observe), the verifier a
Verifier, over the same batch of rows (b = 1: one); only the messages between them are new. No random numbers cross:
the verifier sends its generator's state with the Start message and both ranks draw from it in generate_ssd's
pattern, each using its share (the drafter the draft uniforms, the verifier the verify uniforms).

Clocks: each Report carries when the drafter's blocks ran, so the verifier's trace holds both ranks' spans on one
time axis (``ssd.analysis.plots.timeline``). On one host both ranks read the same monotonic clock; across hosts the drafter's
clock is put on the verifier's by the offset estimated from the first exchange (``clock_offset``, NTP's rule), good
to about half the difference between the two directions' transit times.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch

from ..models.cores import pinned
from ..core.decoding import Verifier
from ..core.proposers import Draft
from ..core.sampling import one_hot, uniforms
from ..core.latencies import Profile
from ..core.speculation import Lookup, SSDConfig, Speculator, backup_used, round_uniforms
from ..core.trace import PipelineRound, Span, Stopwatch, Trace
from ..core.tuning import Autotune
from .transport import Channel
from ..core.verify import Verdict

# ---- the messages --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """Rank 1 -> 0, once: the draft is loaded; where and how it runs."""

    vocab_size: int
    host: str
    pid: int
    device: str
    cores: list[int]
    threads: int
    precision: str


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Report:
    """What the drafter did for one row's round: pre-speculated while it was verified, then looked its outcome up.
    The times are the batch's (one tree and one backup draft serve every row)."""

    prespec_s: float
    draft_s: float  # the lookups, and the backup after a miss; not the wait for the outcome
    hit: bool
    rank: int | None
    backup: str | None  # the backup that drafted the row's next round after a miss
    # When the drafter pre-speculated and drafted, on its own clock (round 0's: also its prompts' pass and first
    # drafts, a span of round None)
    spans: tuple[Span, ...] = ()


@dataclass(frozen=True)
class DraftMessage:
    """Rank 1 -> 0: a round's drafts, by row (their q rows travel beside, stacked in row order, at temperature > 0),
    with the reports of the round before (None for the first). first_drawn (first message only): the sizes of the
    first drafts' uniform draws, row by row; drawn: by row, the K of the next round's draft uniforms the drafter drew
    (with k="auto" only the drafter's tuners know them), which the verifier skips in the shared stream. clock (first
    message only): the drafter's clock when the Start arrived and when this left, for clock_offset."""

    tokens: dict[int, list[int]]
    first_drawn: tuple[int, ...]
    drawn: dict[int, int]
    fan_out: dict[int, tuple[int, ...]]
    a_p: dict[int, float]
    r: dict[int, float]
    previous: dict[int, Report] | None
    clock: tuple[float, ...] = ()


@dataclass(frozen=True)
class Outcome:
    """Rank 0 -> 1: by row, the verdict of its round, whether it is done, and how many tokens its next round may
    draft."""

    verdicts: dict[int, Verdict]
    done: dict[int, bool]
    rooms: dict[int, int]


@dataclass(frozen=True)
class LastReports:
    """Rank 1 -> 0: the reports of the last round, once every row is done."""

    previous: dict[int, Report]


@dataclass(frozen=True)
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
    """Rank 1's side of one generate call: ssd.core.speculation's Speculator over the batch, driven by messages instead of
    calls. received_s: this rank's clock when the Start arrived; autotune: what a call on auto learns from, priced on
    the Start's latencies."""
    config, timeout_s = start.config, start.timeout_s
    generator = torch.Generator()
    generator.set_state(start.generator_state)
    if start.latencies is not None:
        autotune.profiles[len(start.prompts)] = start.latencies
    speculator = Speculator(draft_model, start.prompts, config, start.vocab_size, autotune)
    live = list(range(len(start.prompts)))
    watch, previous, i = Stopwatch(origin=0.0), None, 0  # spans on this rank's own clock, for the verifier

    def plan(drafts, live):
        """What a round's message and pre-speculation need, for each live row in turn: its next K, the draft uniforms
        of that next round (the verify ones are rank 0's share of the row's pair), the a_p and r its fan-out uses."""
        k_next = {row: speculator.k(row) for row in live}
        u_draft = {row: round_uniforms(generator, k_next[row], len(drafts[row].tokens))[0] for row in live}
        return k_next, u_draft, {row: speculator.estimates(row) for row in live}

    # The verifier feeds its prompts with round 0's verify pass, on start.first_cores where it names them (the
    # drafter's too: this rank has nothing to do then). So on such shared cores this rank makes its prompts' pass,
    # its first drafts and round 0's pre-speculation before that verify pass, on both ranks' cores; with cores or a
    # device of its own it pre-speculates round 0 while round 0 is verified, like every later round.
    early = bool(start.first_cores)
    with pinned(list(start.first_cores)) if early else contextlib.nullcontext():
        with watch.before_rounds("draft_s"):  # sent with round 0's report
            # The prompts' pass as generate_ssd makes it (all but each prompt's last token, apart from the first
            # draft): an int8 draft quantizes each forward's activations with one scale, so the same drafts need the
            # same forwards.
            speculator.model.prefill(dict(enumerate(start.prompts)))
            first = tuple(speculator.k(row) for row in live)
            u_first = {row: uniforms(first[row], generator) for row in live}
            drafts = speculator.propose(dict(enumerate(start.rooms)), u_first)
        k_next, u_draft, estimates = plan(drafts, live)
        if early:
            with watch("prespec_s"):
                speculator.prespeculate(u_draft)
    while True:
        q = torch.cat([drafts[row].q for row in live]) if config.temperature > 0 else None  # T = 0: one-hot
        message = DraftMessage({row: drafts[row].tokens for row in live}, first if i == 0 else (), k_next,
                               {row: drafts[row].fan_out for row in live}, {row: e[0] for row, e in estimates.items()},
                               {row: e[1] for row, e in estimates.items()}, previous,
                               (received_s, time.perf_counter()) if i == 0 else ())
        channel.send(message, q, timeout_s=timeout_s, doing=f"sending the drafts of round {i}")
        if not (early and i == 0):
            with watch("prespec_s"):
                speculator.prespeculate(u_draft)  # meanwhile the verifier verifies this round's drafts
        outcome, _ = channel.recv(Outcome, timeout_s=timeout_s, doing=f"waiting for the outcomes of round {i}")
        with watch("draft_s"):
            for row in live:
                speculator.observe(row, drafts[row], outcome.verdicts[row])
            going = [row for row in live if not outcome.done[row]]
            following = speculator.propose({row: outcome.rooms[row] for row in going},
                                           {row: u_draft[row] for row in going})
        spans, seconds = watch.spans_of(i) + (watch.spans_of(None) if i == 0 else ()), watch.take()
        previous = {row: report(speculator.last_lookup(row), following.get(row), spans, **seconds) for row in live}
        for row in live:
            if outcome.done[row]:
                speculator.retire(row)
        if not going:
            channel.send(LastReports(previous), timeout_s=timeout_s, doing="sending the last reports")
            return
        drafts, live, i = following, going, i + 1
        k_next, u_draft, estimates = plan(drafts, live)


def report(lookup: Lookup, following: Draft | None, spans: tuple[Span, ...], *, prespec_s: float, draft_s: float
           ) -> Report:
    return Report(prespec_s=prespec_s, draft_s=draft_s, hit=lookup.hit, rank=lookup.rank,
                  backup=backup_used(following), spans=spans)


def clock_offset(sent_s: float, received_s: float, replied_s: float, answered_s: float) -> float:
    """The drafter's clock minus the verifier's, from one exchange (NTP's estimate): the Start left the verifier at
    sent_s and reached the drafter at received_s; the first drafts left at replied_s and arrived at answered_s. Exact
    when the two transits take equal times; off by half their difference otherwise."""
    return ((received_s - sent_s) + (replied_s - answered_s)) / 2


# ---- rank 0: the verifier ------------------------------------------------------------------------------------------


def verify_rounds(channel: Channel, verifier: Verifier, config: SSDConfig, generator: torch.Generator,
                  vocab_size: int, timeout_s: float, traces: list[Trace], watch: Stopwatch, same_host: bool,
                  first_cores: tuple[int, ...] = (), latencies: Profile | None = None) -> None:
    """Rank 0's side of one generate call: start the drafter, then verify the drafts it sends until every row is
    done, recording each row's rounds in its trace and both ranks' spans in the call's stopwatch (same_host: the
    drafter reads this host's clock). Round 0's verify pass also feeds the target its prompts; it runs on
    first_cores where they are given (Start's: this rank's and the drafter's, which waits for its outcome).
    latencies: on auto, what the drafter's tuners price their choices on."""
    start = Start(verifier.tokens, config, generator.get_state(), [verifier.room(row) for row in verifier.live],
                  vocab_size, timeout_s, time.perf_counter(), tuple(first_cores), latencies)
    channel.send(start, timeout_s=timeout_s, doing="sending the prompts")
    message, q = channel.recv(DraftMessage, timeout_s=timeout_s, doing="waiting for the first drafts")
    offset_s = 0.0 if same_host else clock_offset(start.sent_s, *message.clock, time.perf_counter())
    i = 0
    while verifier.live:
        live = list(verifier.live)
        for n in message.first_drawn:  # the draft uniforms: rank 1's share of the stream
            uniforms(n, generator)
        u_verify = {}
        for row in live:  # each row's pair, in generate_ssd's order: K for its next draft (rank 1's), then verify
            uniforms(message.drawn[row], generator)
            u_verify[row] = uniforms(len(message.tokens[row]) + 1, generator)
        with pinned(list(first_cores)) if i == 0 and first_cores else contextlib.nullcontext(), watch("verify_s"):
            checked = verifier.check(received_drafts(message, q, live, vocab_size, verifier.target.device), u_verify)
        with watch("wait_s"):  # idle until the next drafts: max(0, prespec - verify) after hits, more after a miss
            outcome = Outcome({row: c.verdict for row, c in checked.items()},
                              {row: c.done for row, c in checked.items()}, {row: verifier.room(row) for row in live})
            channel.send(outcome, timeout_s=timeout_s, doing=f"sending the outcomes of round {i}")
            last = not verifier.live
            doing = "waiting for the last reports" if last else f"waiting for the drafts of round {i + 1}"
            answer, q = channel.recv(LastReports if last else DraftMessage, timeout_s=timeout_s, doing=doing)
        seconds = watch.take()
        spec = answer.previous  # what the drafter did while and after this round was verified
        watch.add(spec[live[0]].spans, offset_s)  # the batch's: every row's report holds the same
        all_hit = all(spec[row].hit for row in live if not checked[row].done)  # as generate_ssd's
        for row in live:
            v, fan_out = checked[row].verdict, message.fan_out[row]
            traces[row].rounds.append(PipelineRound(
                draft_len=v.draft_len, accepted=v.accepted, token=v.token, new_tokens=len(checked[row].emitted),
                draft_s=spec[row].draft_s, prespec_s=spec[row].prespec_s, hit=spec[row].hit, rank=spec[row].rank,
                fan_out=fan_out, budget=sum(fan_out), a_p=message.a_p[row], r=message.r[row],
                backup=spec[row].backup, all_hit=all_hit, **seconds))
        message, i = answer, i + 1


def received_drafts(message: DraftMessage, q: torch.Tensor | None, live: list[int], vocab_size: int, device
                    ) -> dict[int, Draft]:
    """The rows' drafts as the verifier checks them: q split by row from the stacked rows that came (T > 0), or
    rebuilt one-hot on the tokens (T = 0)."""
    drafts, at = {}, 0
    for row in live:
        tokens = message.tokens[row]
        if q is None:
            row_q = one_hot(tokens, vocab_size, device)  # [k, V]
        else:
            row_q, at = q[at : at + len(tokens)].to(device), at + len(tokens)  # [k, V]
        drafts[row] = Draft(tokens, row_q, None, message.fan_out[row])
    return drafts
