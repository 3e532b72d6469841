"""Autoregressive (AR) and speculative (SD) decoding over KV caches kept across rounds.

A method has one shape: ``generate(pair, prompt_ids, config, generator) -> (new_tokens, trace)``.

Both loops keep each model's KV cache a prefix of the tokens decoded so far (``ssd.cached_model``); SD drafts through
the proposer interface (``ssd.proposers``), so any proposer plugs into the same verify step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .cached_model import CachedModel
from .outcomes import Calibrator
from .proposers import Draft, DraftModelProposer
from .sampling import check_temperature, probs_from_logits, sample, uniforms
from .trace import Round, Stopwatch, Trace
from .tuning import BUDGETS, MEMORY, PRIOR_WEIGHT, SD_KS, SSD_KS, is_auto, sd_tuner, with_latencies
from .verify import Verdict, verify


@dataclass
class DecodeConfig:
    k: int | str = 4  # draft length K (ignored by AR); "auto": chosen for the machine as the run goes (ssd.tuning)
    temperature: float = 0.0  # 0 means greedy
    max_new_tokens: int = 64
    a_p: float = 0.6  # the acceptance rate assumed before any round: the prior of k="auto" (and of SSD's fan-out)
    # k="auto": the latency profile the choice is priced on (ssd.profile; the methods fetch the cached one if None)
    latencies: object = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if not (is_auto(self.k) or (isinstance(self.k, int) and self.k >= 1)):
            raise ValueError(f"k (the draft length K) must be an integer >= 1 or 'auto', got {self.k!r}")
        if not (isinstance(self.a_p, (int, float)) and 0.0 <= self.a_p <= 1.0):
            raise ValueError(f"a_p must lie in [0, 1], got {self.a_p!r}")
        self.temperature = check_temperature(self.temperature)
        if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")


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


def _finish(appended: list[int], room: int, eos: tuple[int, ...]) -> tuple[list[int], bool]:
    """Cut a round's tokens at the first EOS (kept, as transformers does) and at max_new_tokens."""
    for i, t in enumerate(appended):
        if t in eos:
            return appended[: min(i + 1, room)], True
    return appended[:room], len(appended) >= room


def generate_ar(pair, prompt_ids, config: DecodeConfig, generator: torch.Generator):
    """The target alone, one token per forward: the reference every other method must reproduce."""
    tokens = check_prompt(pair, prompt_ids, config)
    target = CachedModel(pair.target)
    trace, watch = Trace("ar", prompt_len=len(tokens)), Stopwatch()
    with watch.whole(trace):
        watch.prefill(trace, tokens, target)
        new: list[int] = []
        done = False
        while not done:
            with watch("verify_s"):
                logits = target.logits(tokens, keep=1)[0]  # [V]
                token = sample(probs_from_logits(logits, config.temperature), generator)
                emitted, done = _finish([token], config.max_new_tokens - len(new), pair.eos_token_ids)
            tokens += emitted
            new += emitted
            top = logits.topk(min(2, logits.shape[-1])).values.tolist()  # how close a call the greedy token was
            trace.rounds.append(Round(draft_len=0, accepted=0, token=token, new_tokens=len(emitted), draft_s=0.0,
                                      top_logit=top[0], margin=top[0] - top[-1], **watch.take()))
    return new, trace


@dataclass(frozen=True)
class Checked:
    """What the verifier made of one draft."""

    verdict: Verdict  # the outcome (k, t*)
    emitted: list[int]  # the tokens the round added: k accepted + t*, cut at EOS and max_new_tokens
    done: bool  # decoding ends after this round


class Verifier:
    """The target side of SD and SSD: verify a draft, commit what it emits. Lives wherever the target model lives."""

    def __init__(self, target_model, prompt_ids: list[int], config: DecodeConfig, eos_token_ids):
        self.target = CachedModel(target_model)
        self.tokens = list(prompt_ids)
        self.config = config
        self.eos = eos_token_ids
        self.new: list[int] = []

    def room(self) -> int:
        """The most tokens the next round may draft: never past max_new_tokens (a round yields at most K + 1)."""
        return self.config.max_new_tokens - len(self.new) - 1

    def draft_len(self, k: int) -> int:
        """The draft length of the next round at draft length K."""
        return min(k, self.room())

    def check(self, draft: Draft, u_verify: torch.Tensor) -> Checked:
        """Verify one draft in one target pass and commit what it emits. u_verify: [k + 1] uniforms."""
        k = len(draft.tokens)
        logits = self.target.logits(self.tokens + draft.tokens, keep=k + 1)  # [k + 1, V]
        p = probs_from_logits(logits, self.config.temperature)  # [k + 1, V]
        q = draft.q.to(p.device)  # [k, V]
        verdict = verify(torch.tensor(draft.tokens, dtype=torch.long), q, p, u_verify[:-1], u_verify[-1])
        self.target.rollback(len(self.tokens) + verdict.accepted)  # the rejected tail leaves the cache
        appended = draft.tokens[: verdict.accepted] + [verdict.token]
        emitted, done = _finish(appended, self.config.max_new_tokens - len(self.new), self.eos)
        self.tokens += emitted
        self.new += emitted
        return Checked(verdict, emitted, done)


def generate_sd(pair, prompt_ids, config: DecodeConfig, generator: torch.Generator):
    """Speculative decoding: K draft tokens, one target pass over K+1 positions, rejection sampling. With k="auto" the
    K of each round is the tuner's (ssd.tuning), re-decided from the acceptance rate as the run goes."""
    prompt_ids = check_prompt(pair, prompt_ids, config)
    config = with_latencies(pair, config)
    # The run's acceptance rate, for k="auto"
    calibrator = Calibrator(prior_a_p=config.a_p, prior_weight=PRIOR_WEIGHT, memory=MEMORY)
    tuner = sd_tuner(config, calibrator)
    proposer = DraftModelProposer(pair.draft, prompt_ids, config.temperature)
    verifier = Verifier(pair.target, prompt_ids, config, pair.eos_token_ids)
    trace, watch = Trace("sd", prompt_len=len(prompt_ids)), Stopwatch()
    with watch.whole(trace):
        watch.prefill(trace, prompt_ids, verifier.target, proposer.model)
        done = False
        while not done:
            k_round = verifier.draft_len(tuner.k)
            with watch("draft_s"):
                draft = proposer.propose(k_round, uniforms(k_round, generator))
            with watch("verify_s"):
                checked = verifier.check(draft, uniforms(k_round + 1, generator))
            proposer.observe(draft, checked.verdict)
            calibrator.update(checked.verdict.accepted, k_round, None)
            tuner.step()
            done = checked.done
            trace.rounds.append(Round(draft_len=k_round, accepted=checked.verdict.accepted,
                                      token=checked.verdict.token, new_tokens=len(checked.emitted), **watch.take()))
    return verifier.new, trace
