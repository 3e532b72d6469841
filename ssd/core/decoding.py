"""Autoregressive (AR) and speculative (SD) decoding over KV caches kept across rounds, for a batch of sequences.

A method has one shape: ``generate(pair, prompt_ids, config, generator) -> (new_tokens, trace)``; given a list of
prompts (a batch) it returns a list of each (``batchable``). Every step is one forward over all the batch's rows per
model (``ssd.core.cached_model``: ragged rows are padded and masked); the per-sequence logic (sampling, verify, the stop
rules) runs row by row. b = 1 is a batch of one.

Both loops keep each model's KV cache a prefix of each row's tokens; SD drafts through the proposer interface
(``ssd.core.proposers``), so any proposer plugs into the same verify step. Randomness: one generator, drawn row by row
in a fixed pattern each round, so one seed fixes every row's tokens (and b = 1 draws exactly as before batching).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .cached_model import CachedModel
from ..checks import check_decoding, is_auto
from .proposers import Draft, DraftModelProposer
from .sampling import probs_from_logits, sample, uniforms
from .trace import Round, Trace, Unclocked
from .tuning import BUDGETS, SD_KS, SSD_KS, Autotune, DraftLengths
from .verify import Verdict, verify


@dataclass
class DecodeConfig:
    """The algorithm's settings, nothing else: a method decodes the batch it is given (the bench's variants and the
    command line's --batch-size say how many prompts go at once), and a run on auto is given what it is priced on
    and learns from (``ssd.core.tuning.Autotune``)."""

    k: int | str = 4  # draft length K (ignored by AR); "auto": chosen for the machine as the run goes (ssd.core.tuning)
    temperature: float = 0.0  # 0 means greedy
    max_new_tokens: int = 64
    a_p: float = 0.6  # the acceptance rate assumed before any round: the prior of k="auto" (and of SSD's fan-out)

    def __post_init__(self):
        check_decoding(self.k, self.a_p, self.temperature, self.max_new_tokens)
        self.temperature = float(self.temperature)


def check_prompt(pair, prompt_ids, config: DecodeConfig) -> list[int]:
    prompt_ids = [int(t) for t in prompt_ids]
    if not prompt_ids:
        raise ValueError("prompt_ids is empty: give at least one token")
    bad = [t for t in prompt_ids if not 0 <= t < pair.vocab_size]
    if bad:
        raise ValueError(f"prompt_ids holds ids outside the vocabulary [0, {pair.vocab_size}): {bad[:5]}")
    room = pair.max_context - len(prompt_ids)
    if room < 1:
        raise ValueError(
            f"prompt_ids has {len(prompt_ids)} tokens, longer than the context of {pair.max_context} tokens"
        )
    if config.max_new_tokens > room:
        raise ValueError(
            f"max_new_tokens={config.max_new_tokens} does not fit: the prompt has {len(prompt_ids)} tokens and the "
            f"context holds {pair.max_context}, so at most {room} new tokens"
        )
    check_window(pair, len(prompt_ids), config)
    return prompt_ids


def check_prompts(pair, prompts, config: DecodeConfig) -> list[list[int]]:
    """A batch's prompts, each checked; a sliding-window model decodes one sequence at a time (see check_window)."""
    if not prompts:
        raise ValueError("prompts is empty: give at least one prompt")
    if len(prompts) > 1 and pair.attention_window is not None:
        raise ValueError(f"{pair.attention_window[1]} attends through a sliding window, whose cache cannot hold a "
                         f"batch's padded and masked slots: give one prompt at a time (batch size 1)")
    return [check_prompt(pair, p, config) for p in prompts]


def as_batch(prompt_ids) -> tuple[list[list[int]], bool]:
    """One prompt (a list of ids) or a batch (a list of them) as a batch, and whether it was one prompt."""
    prompt_ids = list(prompt_ids)
    single = not prompt_ids or not isinstance(prompt_ids[0], (list, tuple))
    return ([prompt_ids] if single else [list(p) for p in prompt_ids]), single


def batchable(generate):
    """A method written for a batch, `generate(pair, prompts, config, generator) -> (tokens per row, traces)`, that
    also takes one prompt (a list of ids) and then returns (its tokens, its trace). Keyword options (the tuned methods'
    autotune) pass through."""

    @functools.wraps(generate)
    def method(pair, prompt_ids, config, generator, **options):
        prompts, single = as_batch(prompt_ids)
        try:
            new, traces = generate(pair, prompts, config, generator, **options)
        except RuntimeError as e:  # torch.OutOfMemoryError (a GPU) is one; the CPU allocator raises a plain one
            if not _out_of_memory(e):
                raise
            cause = str(e).strip().splitlines()[0][:200]
            raise ValueError(f"batch_size={len(prompts)}: the batch did not fit in memory ({cause}); give a smaller "
                             "batch_size or fewer max_new_tokens") from None
        return (new[0], traces[0]) if single else (new, traces)

    return method


def _out_of_memory(error: RuntimeError) -> bool:
    text = str(error)
    return isinstance(error, torch.OutOfMemoryError) or "can't allocate memory" in text or "out of memory" in text


def check_window(pair, prompt_len: int, config) -> None:
    """A model with sliding-window attention (Mistral, Gemma 2 and 3, ...) decodes only while every cache stays inside
    its window: once full, the window's cache drops the oldest tokens and cannot be cut back after a rejection (nor
    take SSD's token tree). The most a cache holds at once: the prompt, max_new_tokens, and the tokens in flight, K
    drafted and verified plus B branches of K for SSD's tree (K and B on auto: the largest the tuner weighs)."""
    if pair.attention_window is None:
        return
    window, model = pair.attention_window
    k = max(SD_KS + SSD_KS) if is_auto(config.k) else config.k  # SD and SSD weigh their own candidates
    budget = getattr(config, "budget", 0)
    budget = max(BUDGETS) if is_auto(budget) else budget
    in_flight = k * (budget + 1) + 1
    if prompt_len + config.max_new_tokens + in_flight > window - 1:
        raise ValueError(
            f"{model} attends through a sliding window of {window} tokens, whose cache cannot be cut back once full: "
            f"the prompt ({prompt_len} tokens), max_new_tokens={config.max_new_tokens} and {in_flight} tokens in "
            f"flight (K={k}, B={budget}) must stay below {window - 1}"
        )


def cut(appended: list[int], room: int, eos: tuple[int, ...]) -> tuple[list[int], bool]:
    """Cut a round's tokens at the first EOS (kept, as transformers does) and at max_new_tokens."""
    for i, t in enumerate(appended):
        if t in eos:
            return appended[: min(i + 1, room)], True
    return appended[:room], len(appended) >= room


@batchable
def generate_ar(pair, prompts, config: DecodeConfig, generator: torch.Generator, clock=None):
    """The target alone, one token per forward (over all rows): the reference every other method must reproduce.
    clock: what times the phases (``ssd.clock.Stopwatch``; None: nothing is timed); one that asks for margins also
    gets, each round, the target's top logit and its lead over the second (how near a tie the greedy token was)."""
    tokens = check_prompts(pair, prompts, config)
    clock = clock or Unclocked()
    target = CachedModel(pair.target, len(tokens))
    new, live = [[] for _ in tokens], list(range(len(tokens)))
    traces = batch_traces("ar", tokens)
    # No pass of its own for the prompts: the first step feeds them, as transformers' generate does (one forward
    # fewer); that first round counts as the prompts' pass in decode tokens/s.
    with clock.whole(*traces):
        while live:
            with clock("verify_s"):
                logits = target.logits({row: tokens[row] for row in live}, keep=1)  # {row: [1, V]}
                steps = {row: _step(logits[row][0], config, generator) for row in live}
            seconds = clock.take()
            for row in list(live):
                emitted, done = cut([steps[row]], config.max_new_tokens - len(new[row]), pair.eos_token_ids)
                tokens[row] += emitted
                new[row] += emitted
                traces[row].rounds.append(Round(draft_len=0, accepted=0, token=steps[row], new_tokens=len(emitted),
                                                **_margin(logits[row][0], clock), **seconds))
                if done:
                    live.remove(row)
                    target.retire(row)
    return new, traces


def _step(logits: torch.Tensor, config: DecodeConfig, generator: torch.Generator) -> int:
    """AR's token from one row's logits [V]."""
    if config.temperature == 0:
        uniforms(1, generator)  # the generator advances as in sampling: the stream does not depend on T
        return int(logits.argmax())  # the first of equal maxima, as the one-hot draw of the sampling path gives it
    return sample(probs_from_logits(logits, config.temperature), generator)


def _margin(logits: torch.Tensor, clock) -> dict[str, float]:
    """The round's top_logit and margin where the clock asks for them (a measured call), else nothing."""
    if not clock.margins:
        return {}
    top, second = _top_two(logits)
    return {"top_logit": top, "margin": top - second}


def _top_two(logits: torch.Tensor) -> tuple[float, float]:
    """The two largest logits of a row [V] (equal when the maximum is repeated), in two passes over the vocabulary:
    a top-k took three times as long (152k logits, one thread)."""
    top, token = logits.max(-1)
    others = [part.max() for part in (logits[: int(token)], logits[int(token) + 1 :]) if len(part)]
    return float(top), float(max(others)) if others else float(top)


def batch_traces(method: str, prompts: list[list[int]]) -> list[Trace]:
    """One trace per row; a round's phase times are the batch's, the same in every row's record."""
    return [Trace(method, prompt_len=len(p), batch_size=len(prompts)) for p in prompts]


@dataclass(frozen=True)
class Checked:
    """What the verifier made of one draft."""

    verdict: Verdict  # the outcome (k, t*)
    emitted: list[int]  # the tokens the round added: k accepted + t*, cut at EOS and max_new_tokens
    done: bool  # decoding ends after this round


class Verifier:
    """The target side of SD and SSD: verify each row's draft, commit what it emits. Lives wherever the target
    model lives."""

    def __init__(self, target_model, prompts: list[list[int]], config: DecodeConfig, eos_token_ids):
        self.target = CachedModel(target_model, len(prompts))
        self.tokens = [list(p) for p in prompts]  # per row: prompt + output so far
        self.config = config
        self.eos = eos_token_ids
        self.new: list[list[int]] = [[] for _ in prompts]
        self.live = list(range(len(prompts)))  # the rows still decoding, in order

    def room(self, row: int = 0) -> int:
        """The most tokens the row's next round may draft: never past max_new_tokens (a round yields at most K + 1)."""
        return self.config.max_new_tokens - len(self.new[row]) - 1

    def draft_len(self, k: int, row: int = 0) -> int:
        """The draft length of the row's next round at draft length K."""
        return min(k, self.room(row))

    def verify(self, drafts: dict[int, Draft], u_verify: dict[int, torch.Tensor]) -> dict[int, Checked]:
        """Verify every row's draft in one target pass and commit what each emits. u_verify[row]: [k + 1] uniforms."""
        logits = self.target.logits({row: self.tokens[row] + d.tokens for row, d in drafts.items()},
                                    keep={row: len(d.tokens) + 1 for row, d in drafts.items()})  # {row: [k + 1, V]}
        return {row: self._judge(row, draft, logits[row], u_verify[row]) for row, draft in drafts.items()}

    def _judge(self, row: int, draft: Draft, logits: torch.Tensor, u_verify: torch.Tensor) -> Checked:
        """One sequence's verdict from its target logits [k + 1, V]; a finished row leaves the batch."""
        p = probs_from_logits(logits, self.config.temperature)  # [k + 1, V]
        q = draft.q.to(p.device)  # [k, V]
        verdict = verify(torch.tensor(draft.tokens, dtype=torch.long), q, p, u_verify[:-1], u_verify[-1],
                         greedy=self.config.temperature == 0)
        self.target.rollback(len(self.tokens[row]) + verdict.accepted, row)  # the rejected tail leaves the cache
        appended = draft.tokens[: verdict.accepted] + [verdict.token]
        emitted, done = cut(appended, self.config.max_new_tokens - len(self.new[row]), self.eos)
        self.tokens[row] += emitted
        self.new[row] += emitted
        if done:
            self.live.remove(row)
            self.target.retire(row)
        return Checked(verdict, emitted, done)


@batchable
def generate_sd(pair, prompts, config: DecodeConfig, generator: torch.Generator, autotune: Autotune | None = None,
                clock=None):
    """Speculative decoding: K draft tokens, one target pass over K+1 positions, rejection sampling; each step over
    all rows at once. With k="auto" each row's K is its tuner's (``ssd.core.tuning.DraftLengths``), priced on the
    autotune's profile at this batch size. clock: what times the phases (``ssd.clock.Stopwatch``; None: nothing)."""
    prompts = check_prompts(pair, prompts, config)
    clock = clock or Unclocked()
    lengths = DraftLengths(config, len(prompts), autotune)  # (an SSDConfig's budget or backup is not SD's concern)
    proposer = DraftModelProposer(pair.draft, prompts, config.temperature)
    verifier = Verifier(pair.target, prompts, config, pair.eos_token_ids)
    traces = batch_traces("sd", prompts)
    # The prompts go in with the first round: the draft's first step and the target's first verify pass feed them
    # (one forward fewer per model, as transformers' assisted generation does).
    with clock.whole(*traces):
        while verifier.live:
            ks = {row: verifier.draft_len(lengths.k(row), row) for row in verifier.live}
            with clock("draft_s"):
                drafts = proposer.propose(ks, {row: uniforms(k, generator) for row, k in ks.items()})
            with clock("verify_s"):
                checked = verifier.verify(drafts, {row: uniforms(k + 1, generator) for row, k in ks.items()})
            seconds = clock.take()
            for row, c in checked.items():
                proposer.observe(row, drafts[row], c.verdict)
                lengths.observe(row, c.verdict)
                if c.done:
                    proposer.retire(row)
                traces[row].rounds.append(Round(draft_len=ks[row], accepted=c.verdict.accepted, token=c.verdict.token,
                                                new_tokens=len(c.emitted), **seconds))
    return verifier.new, traces
