"""One SSD round, written once: the drafter's side, the verifier's side, the draws they share and the round's record.

    drafter (DrafterSide)                                  verifier (VerifierSide)
    DraftMessage r: each row's x_1..x_K           ---->    check: verify round r's drafts, one target pass
      (+ q rows if T > 0)
    pre-speculate round r + 1 for every
      predicted outcome of every row (one tree)
                                                 <----     Verdicts: each row's outcome (k, t*), done, room
    follow: observe; a hit takes a row's draft r + 1
      from its cache, the rows that missed are drafted
      by the backup together
    DraftMessage r + 1 (+ round r's Reports)      ---->    record round r

``verify_rounds`` is the round as the verifier runs it, in three steps, over a speculator: ``InProcess`` (the drafter
beside it: single-process SSD, ``generate_ssd``, where the phases run one after the other, pre-speculation, verify,
then the lookups and backup, and Theorem 7 says what overlapping them would give) or the pipeline's ``Remote``
(``ssd.pipeline.protocol``: the drafter on another rank, behind a channel that carries the same messages, where
pre-speculation overlaps verify).

Randomness: every uniform of a run is drawn by one ``Draws`` over the caller's generator, in one order: the first
drafts' K per row before round 0, then each round, row by row, the K for the row's next draft and draft_len + 1 to
verify this one, whatever happens. In one process both sides share one Draws; in the pipeline each rank has its own
over the same generator state, and each takes its share of the same draws.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from .decoding import Checked, Verifier
from .proposers import Draft
from .sampling import one_hot, uniforms
from .trace import SSDRound, Trace
from .verify import Verdict

BACKUP_OF = {"draft": "jit", "ngram": "fast"}  # the backup each proposer's drafts come from, by Draft.source


class Draws:
    """Every uniform of one SSD call, drawn once, in the order above. A side asks for a round's draws by its index;
    the first ask draws them, and an ask for the round drawn last (the other side's, in one process) gets the same
    tensors again."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator
        self.first_drafts: dict[int, torch.Tensor] | None = None  # by row: the first drafts' [K] uniforms
        self.last: tuple[int, tuple[dict, dict]] | None = None  # (round, its pairs): the round drawn last

    def first(self, ks: dict[int, int]) -> dict[int, torch.Tensor]:
        """By row, in row order: the [K] uniforms of the first drafts (ks[row]: the row's K)."""
        if self.first_drafts is None:
            self.first_drafts = {row: uniforms(k, self.generator) for row, k in ks.items()}
        self._in_step(self.first_drafts, ks)
        return self.first_drafts

    def round(self, i: int, ks: dict[int, int], draft_lens: dict[int, int]) -> tuple[dict, dict]:
        """Round i's draws, by row: ([K] uniforms of the row's next draft, [draft_len + 1] to verify this one); each
        row draws its pair in turn. ks: the rows' K of their next draft; draft_lens: of this round's drafts."""
        if self.first_drafts is None:
            raise RuntimeError("Draws.round before Draws.first: the first drafts' uniforms come first")
        if self.last is None or self.last[0] != i:
            pairs = {row: (uniforms(ks[row], self.generator), uniforms(draft_lens[row] + 1, self.generator))
                     for row in ks}
            self.last = i, ({row: p[0] for row, p in pairs.items()}, {row: p[1] for row, p in pairs.items()})
        u_draft, u_verify = self.last[1]
        self._in_step(u_draft, ks)
        self._in_step(u_verify, {row: n + 1 for row, n in draft_lens.items()})
        return u_draft, u_verify

    @staticmethod
    def _in_step(drawn: dict[int, torch.Tensor], sizes: dict[int, int]) -> None:
        """Both sides must ask for the same sizes: a mismatch means they drift apart (a protocol bug), never noise."""
        if {row: len(u) for row, u in drawn.items()} != sizes:
            raise RuntimeError(f"the two sides' draws are out of step: drawn {[len(u) for u in drawn.values()]}, "
                               f"asked for {list(sizes.values())}")


# ---- the messages between the sides (plain frozen records: the pipeline sends them as they are) -------------------


@dataclass(frozen=True, kw_only=True)
class Report:
    """What the drafter did for one row's round: pre-speculated while it was verified, then looked its outcome up.
    The times are the batch's (one tree and one backup draft serve every row)."""

    prespec_s: float
    draft_s: float  # the lookups, and the backup after a miss; not the wait for the outcome
    hit: bool
    rank: int | None
    backup: str | None  # the backup that drafted the row's next round after a miss
    # When the drafter pre-speculated and drafted, on its own clock (round 0's: also its prompts' pass and first
    # drafts where they were timed, a span of round None)
    spans: tuple = ()  # ssd.clock.Span


@dataclass(frozen=True, kw_only=True)
class DraftMessage:
    """Drafter -> verifier: a round's drafts, by row (their q rows travel beside, stacked in row order, at
    temperature > 0), with the reports of the round before (None for the first). drawn: by row, the K of the next
    round's draft uniforms (with k="auto" only the drafter's tuners know them), whose share of the draws the
    verifier skips; first_drawn (round 0 only): the first drafts' K by row."""

    round: int
    tokens: dict[int, list[int]]
    drawn: dict[int, int]
    fan_out: dict[int, tuple[int, ...]]
    a_p: dict[int, float]  # the a_p and r each row's fan-out used
    r: dict[int, float]
    previous: dict[int, Report] | None = None
    first_drawn: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Verdicts:
    """Verifier -> drafter: by row, the verdict of its round, whether it is done, and how many tokens its next round
    may draft."""

    verdicts: dict[int, Verdict]
    done: dict[int, bool]
    rooms: dict[int, int]


# ---- the drafter's side ------------------------------------------------------------------------------------------


class DrafterSide:
    """A Speculator (``ssd.core.speculation``) driven round by round over a batch's live rows. It times its phases
    on the clock it is given (the call's ``side()``: its own readings, origin 0.0), whose spans go to the verifier
    with each round's reports, as they would from another process."""

    def __init__(self, speculator, draws: Draws, clock):
        self.speculator, self.draws = speculator, draws
        self.clock = clock
        self.round = 0
        self.live: list[int] = []
        self.drafts: dict[int, Draft] = {}  # the drafts of the round in hand, by live row
        self.first_drawn: dict[int, int] = {}  # by row: K of the first drafts
        # What the round in hand needs of the drafter, by row (``_plan``): the K of the row's next draft, that
        # draft's uniforms, the a_p and r of its fan-out
        self.k_next: dict[int, int] = {}
        self.u_draft: dict[int, torch.Tensor] = {}
        self.estimates: dict[int, tuple[float, float]] = {}

    def start(self, prompts: list[list[int]], rooms: dict[int, int]) -> None:
        """Feed the draft its prompts and draft round 0; rooms[row]: the most tokens it may draft.

        The prompts' pass is all but each prompt's last token, apart from the first draft, in both drivers: an int8
        draft quantizes each forward's activations with one scale, so the same drafts need the same forwards."""
        spec = self.speculator
        spec.model.prefill(dict(enumerate(prompts)))
        self.live = list(rooms)
        self.first_drawn = {row: spec.k(row) for row in self.live}
        self.drafts = spec.propose(rooms, self.draws.first(self.first_drawn))
        self._plan()

    def _plan(self) -> None:
        """What the round in hand needs from the drafter: each row's next K, the draft uniforms of that next round
        (its share of the row's pair) and the a_p and r its fan-out uses."""
        spec = self.speculator
        self.k_next = {row: spec.k(row) for row in self.live}
        lens = {row: len(self.drafts[row].tokens) for row in self.live}
        self.u_draft, _ = self.draws.round(self.round, self.k_next, lens)
        self.estimates = {row: spec.estimates(row) for row in self.live}

    def message(self, previous: dict[int, Report] | None) -> tuple[DraftMessage, torch.Tensor | None]:
        """The round's drafts for the verifier, with the reports of the round before, and their stacked q rows
        ([n, V]; None at temperature 0, where q is one-hot on the tokens and the verifier rebuilds it)."""
        live, drafts = self.live, self.drafts
        q = torch.cat([drafts[row].q for row in live]) if self.speculator.config.temperature > 0 else None
        message = DraftMessage(
            round=self.round, tokens={row: drafts[row].tokens for row in live}, drawn=self.k_next,
            fan_out={row: drafts[row].fan_out for row in live}, a_p={row: self.estimates[row][0] for row in live},
            r={row: self.estimates[row][1] for row in live}, previous=previous,
            first_drawn=self.first_drawn if self.round == 0 else {})
        return message, q

    def prespeculate(self) -> None:
        """Fill every live row's cache with the next round's draft for each predicted outcome of the round in hand."""
        with self.clock("prespec_s"):
            self.speculator.prespeculate(self.u_draft)

    def follow(self, verdicts: Verdicts) -> dict[int, Report]:
        """Commit each row's outcome and look it up; draft the next round of the rows that go on (a hit from the
        cache, the misses by the backup together). Returns the round's reports, by row."""
        spec, live = self.speculator, self.live
        with self.clock("draft_s"):
            for row in live:
                spec.observe(row, self.drafts[row], verdicts.verdicts[row])
            going = [row for row in live if not verdicts.done[row]]
            following = spec.propose({row: verdicts.rooms[row] for row in going},
                                     {row: self.u_draft[row] for row in going})
        spans = self.clock.spans_of(self.round) + (self.clock.spans_of(None) if self.round == 0 else ())
        seconds = self.clock.take()
        reports = {row: Report(prespec_s=seconds.get("prespec_s", 0.0), draft_s=seconds.get("draft_s", 0.0),
                               hit=spec.last_lookup(row).hit, rank=spec.last_lookup(row).rank,
                               backup=backup_used(following.get(row)), spans=spans) for row in live}
        for row in live:
            if verdicts.done[row]:
                spec.retire(row)
        self.drafts, self.live, self.round = following, going, self.round + 1
        if going:
            self._plan()
        return reports


def backup_used(following: Draft | None) -> str | None:
    """The backup that drafted the next round after a miss ("jit" or "fast"); None after a hit or the last round."""
    return None if following is None or following.source == "cache" else BACKUP_OF[following.source]


# ---- the verifier's side -----------------------------------------------------------------------------------------


class VerifierSide:
    """A Verifier (``ssd.core.decoding``) driven round by round: verify each DraftMessage, answer its Verdicts, and
    record the round in each row's trace once the drafter's reports are in. Times go to the call's clock, the
    drafter's spans with them; each round is recorded as a `record` (SSDRound; the pipeline's PipelineRound adds the
    wait)."""

    def __init__(self, verifier: Verifier, draws: Draws, traces: list[Trace], clock, vocab_size: int,
                 record: type[SSDRound] = SSDRound):
        self.verifier, self.draws, self.traces, self.clock = verifier, draws, traces, clock
        self.vocab_size, self.record_type = vocab_size, record
        self.round = 0
        self.checked: tuple[DraftMessage, list[int], dict[int, Checked]] | None = None  # the round awaiting reports

    def verify(self, message: DraftMessage, q: torch.Tensor | None) -> Verdicts:
        """Verify the round's drafts (q: their stacked rows, or None at temperature 0) and commit what they emit."""
        verifier, live = self.verifier, list(self.verifier.live)
        if message.round != self.round:
            raise RuntimeError(f"the drafts of round {message.round} came while round {self.round} was due")
        if self.round == 0:
            self.draws.first(message.first_drawn)  # the drafter's share: skipped (one process: drawn already)
        _, u_verify = self.draws.round(self.round, message.drawn, {row: len(message.tokens[row]) for row in live})
        drafts = received_drafts(message, q, live, self.vocab_size, verifier.target.device)
        with self.clock("verify_s"):
            checked = verifier.verify(drafts, u_verify)
        self.checked = message, live, checked
        return Verdicts(verdicts={row: c.verdict for row, c in checked.items()},
                       done={row: c.done for row, c in checked.items()},
                       rooms={row: verifier.room(row) for row in live})

    def record(self, reports: dict[int, Report], offset_s: float = 0.0) -> None:
        """Record the round last checked, with the drafter's reports on it (and its spans, whose clock is offset_s
        ahead of this one's: 0 on one host)."""
        message, live, checked = self.checked
        seconds = self.clock.take()
        self.clock.add(reports[live[0]].spans, offset_s)  # the batch's: every row's report holds the same
        # Only the rows that go on wait for a draft: a finishing row's lookup is moot (trace.final_rounds)
        all_hit = all(reports[row].hit for row in live if not checked[row].done)
        for row in live:
            record = round_record(self.record_type, checked[row], message, row, reports[row], all_hit, seconds)
            self.traces[row].rounds.append(record)
        self.round += 1


def round_record(record: type[SSDRound], checked: Checked, message: DraftMessage, row: int, report: Report,
                 all_hit: bool, seconds: dict[str, float]) -> SSDRound:
    """The trace's record of one row's round: the verdict, what the drafts were made with (message), what the drafter
    did (report), and the verifier's times (seconds: verify_s, and the pipeline's wait_s). all_hit: every row of the
    batch that goes on hit this round."""
    v, fan_out = checked.verdict, message.fan_out[row]
    return record(draft_len=v.draft_len, accepted=v.accepted, token=v.token, new_tokens=len(checked.emitted),
                draft_s=report.draft_s, prespec_s=report.prespec_s, hit=report.hit, rank=report.rank, fan_out=fan_out,
                budget=sum(fan_out), a_p=message.a_p[row], r=message.r[row], backup=report.backup, all_hit=all_hit,
                **seconds)


def received_drafts(message: DraftMessage, q: torch.Tensor | None, live: list[int], vocab_size: int, device
                    ) -> dict[int, Draft]:
    """The rows' drafts as the verifier checks them: q split by row from the stacked rows (T > 0), or rebuilt
    one-hot on the tokens (T = 0, where greedy verification reads only the tokens)."""
    drafts, at = {}, 0
    for row in live:
        tokens = message.tokens[row]
        if q is None:
            row_q = one_hot(tokens, vocab_size, device)  # [k, V]
        else:
            row_q, at = q[at : at + len(tokens)].to(device), at + len(tokens)  # [k, V]
        drafts[row] = Draft(tokens, row_q, None, message.fan_out[row])
    return drafts


class InProcess:
    """The speculator beside the verifier (single-process SSD): its drafter side, driven by ``verify_rounds``. It
    pre-speculates before the verify pass (one process: the verifier waits for it), and answers the verdicts at once."""

    offset_s = 0.0  # the drafter's clock minus the verifier's: the same clock

    def __init__(self, drafter: DrafterSide):
        self.drafter = drafter

    def drafts(self) -> tuple[DraftMessage, torch.Tensor | None]:
        return self.drafter.message(None)

    @contextlib.contextmanager
    def meanwhile(self):
        self.drafter.prespeculate()
        yield

    def follow(self, verdicts: Verdicts) -> dict[int, Report]:
        return self.drafter.follow(verdicts)


def verify_rounds(side: VerifierSide, speculator) -> None:
    """SSD's rounds as the verifier runs them, until every row is done, over a speculator (``InProcess``, or the
    pipeline's ``Remote``): drafts() gives a round's drafts, meanwhile() pre-speculates while they are verified,
    follow(verdicts) looks each row's outcome up and drafts the next round, returning what it did (the Reports)."""
    while side.verifier.live:
        message, q = speculator.drafts()  # 1. the drafts of this round (from the cache after a hit)
        with speculator.meanwhile():  # 2. verified, while the next round is pre-speculated for every outcome
            verdicts = side.verify(message, q)
        reports = speculator.follow(verdicts)  # 3. each outcome looked up, learnt from, and the next round drafted
        side.record(reports, speculator.offset_s)
