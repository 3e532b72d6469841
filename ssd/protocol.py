"""The pipeline's protocol: the messages the two ranks exchange, and each rank's loop over one generate call.

    drafter (rank 1)                                       verifier (rank 0)
    DraftMessage r: x_1..x_K (+ q rows if T > 0)  ---->    verify draft r: one target pass
    pre-speculate round r + 1 for every                    ...
      predicted outcome of round r
                                                 <----     Outcome: the verdict (k, t*), done
    observe: a hit takes draft r + 1 from the
      cache, a miss has the backup draft it
    DraftMessage r + 1 (+ round r's Report)       ---->

Both loops are ``ssd.ssd``'s: the drafter drives a Speculator (propose, prespeculate, observe), the verifier a
Verifier; only the messages between them are new. No random numbers cross: the verifier sends its generator's state
with the Start message and both ranks draw from it in generate_ssd's pattern, each using its share (the drafter the
draft uniforms, the verifier the verify uniforms).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .decoding import Verifier
from .proposers import Draft
from .sampling import one_hot, uniforms
from .ssd import Lookup, SSDConfig, Speculator, backup_used, round_uniforms
from .trace import PipelineRound, Stopwatch, Trace
from .transport import Channel
from .verify import Verdict

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
    """Rank 0 -> 1: a generate call begins."""

    prompt_ids: list[int]
    config: SSDConfig
    generator_state: torch.Tensor  # the verifier's generator: both ranks draw the same stream
    room: int  # the most tokens the first round may draft (max_new_tokens - 1)
    vocab_size: int
    timeout_s: float


@dataclass(frozen=True)
class Report:
    """What the drafter did for one round: pre-speculated while it was verified, then looked its outcome up."""

    prespec_s: float
    draft_s: float  # the lookup, and the backup after a miss; not the wait for the outcome
    hit: bool
    rank: int | None
    backup: str | None  # the backup that drafted the next round after a miss


@dataclass(frozen=True)
class DraftMessage:
    """Rank 1 -> 0: a round's draft (its q rows travel beside it at temperature > 0), with the report of the round
    before (None for the first). drawn: the sizes of the draft-uniform draws the drafter made since its last message
    (K of the next round's drafts, and first K of the first draft's; with k="auto" only the drafter's tuner knows
    them), which the verifier skips in the shared stream."""

    tokens: list[int]
    drawn: tuple[int, ...]
    fan_out: tuple[int, ...]
    a_p: float
    r: float
    previous: Report | None


@dataclass(frozen=True)
class Outcome:
    """Rank 0 -> 1: the verdict of a round, whether decoding is done, and how many tokens the next round may draft."""

    verdict: Verdict
    done: bool
    room: int


@dataclass(frozen=True)
class Stop:
    """Rank 0 -> 1: no more generate calls."""


# ---- rank 1: the drafter -------------------------------------------------------------------------------------------


def serve(channel: Channel, draft_model) -> None:
    """Rank 1 once its draft is loaded: one generate call per Start message, until Stop."""
    while True:
        start, _ = channel.recv(Start, Stop, timeout_s=None, doing="waiting for the next generate call")
        if isinstance(start, Stop):
            return
        speculate(channel, draft_model, start)


def speculate(channel: Channel, draft_model, start: Start) -> None:
    """Rank 1's side of one generate call: ssd.ssd's Speculator, driven by messages instead of calls."""
    config, timeout_s = start.config, start.timeout_s
    generator = torch.Generator()
    generator.set_state(start.generator_state)
    speculator = Speculator(draft_model, start.prompt_ids, config, start.vocab_size)
    first_k = speculator.k
    draft = speculator.propose(start.room, uniforms(first_k, generator))
    watch, previous, i = Stopwatch(), None, 0
    while True:
        k_next = speculator.k
        u_draft, _ = round_uniforms(generator, k_next, len(draft.tokens))  # the verify uniforms are rank 0's share
        a_p, r = speculator.estimates()
        q = draft.q if config.temperature > 0 else None  # at temperature 0 q is one-hot on the tokens
        drawn = (k_next,) if i else (first_k, k_next)  # the first message also answers for the first draft's
        channel.send(DraftMessage(draft.tokens, drawn, draft.fan_out, a_p, r, previous), q, timeout_s=timeout_s,
                     doing=f"sending the draft of round {i}")
        with watch("prespec_s"):
            speculator.prespeculate(u_draft)  # meanwhile the verifier verifies this round's draft
        outcome, _ = channel.recv(Outcome, timeout_s=timeout_s, doing=f"waiting for the outcome of round {i}")
        with watch("draft_s"):
            speculator.observe(draft, outcome.verdict)
            following = None if outcome.done else speculator.propose(outcome.room, u_draft)
        previous = report(speculator.last_lookup, following, **watch.take())
        if outcome.done:
            channel.send(previous, timeout_s=timeout_s, doing="sending the last report")
            return
        draft, i = following, i + 1


def report(lookup: Lookup, following: Draft | None, *, prespec_s: float, draft_s: float) -> Report:
    return Report(prespec_s=prespec_s, draft_s=draft_s, hit=lookup.hit, rank=lookup.rank,
                  backup=backup_used(following))


# ---- rank 0: the verifier ------------------------------------------------------------------------------------------


def verify_rounds(channel: Channel, verifier: Verifier, config: SSDConfig, generator: torch.Generator,
                  vocab_size: int, timeout_s: float, trace: Trace) -> None:
    """Rank 0's side of one generate call, its prompt already in the target's cache: start the drafter, then verify
    each draft it sends until done, recording every round in `trace`."""
    start = Start(verifier.tokens, config, generator.get_state(), verifier.room(), vocab_size, timeout_s)
    channel.send(start, timeout_s=timeout_s, doing="sending the prompt")
    message, q = channel.recv(DraftMessage, timeout_s=timeout_s, doing="waiting for the first draft")
    watch, done, i = Stopwatch(), False, 0
    while not done:
        for n in message.drawn:  # the draft uniforms: rank 1's share of the stream
            uniforms(n, generator)
        u_verify = uniforms(len(message.tokens) + 1, generator)
        with watch("verify_s"):
            q = one_hot(message.tokens, vocab_size, verifier.target.device) if q is None else q  # [k, V]
            checked = verifier.check(Draft(message.tokens, q, None, message.fan_out), u_verify)
        done = checked.done
        with watch("wait_s"):  # idle until the next draft: max(0, prespec - verify) after a hit, more after a miss
            channel.send(Outcome(checked.verdict, done, verifier.room()), timeout_s=timeout_s,
                         doing=f"sending the outcome of round {i}")
            doing = "waiting for the last report" if done else f"waiting for the draft of round {i + 1}"
            answer, q = channel.recv(Report if done else DraftMessage, timeout_s=timeout_s, doing=doing)
        spec = answer if done else answer.previous  # what the drafter did while and after this round was verified
        v = checked.verdict
        trace.rounds.append(PipelineRound(
            draft_len=v.draft_len, accepted=v.accepted, token=v.token, new_tokens=len(checked.emitted),
            draft_s=spec.draft_s, prespec_s=spec.prespec_s, hit=spec.hit, rank=spec.rank, fan_out=message.fan_out,
            budget=sum(message.fan_out), a_p=message.a_p, r=message.r, backup=spec.backup, **watch.take()))
        message, i = answer, i + 1
