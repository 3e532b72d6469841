"""Autoregressive (AR) and speculative (SD) decoding over KV caches kept across rounds.

A method has one shape: ``generate(pair, prompt_ids, config, generator) -> (new_tokens, trace)``.

The invariant both loops keep: a model's KV cache holds a prefix of ``tokens`` (prompt + output so far), and a
forward feeds exactly the tokens the cache lacks. After a rejection the caches are cropped back to the accepted
prefix, so the prompt is encoded once and never again.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from .sampling import check_temperature, probs_from_logits, sample, sample_from_uniform, uniforms
from .trace import Round, Trace
from .verify import verify


@dataclass
class DecodeConfig:
    k: int = 4  # draft length K (ignored by AR)
    temperature: float = 0.0  # 0 means greedy
    max_new_tokens: int = 64

    def __post_init__(self):
        if not (isinstance(self.k, int) and self.k >= 1):
            raise ValueError(f"k (the draft length K) must be an integer >= 1, got {self.k!r}")
        self.temperature = check_temperature(self.temperature)
        if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")


class CachedModel:
    """A causal LM and its KV cache, which always covers a prefix of the sequence being decoded."""

    def __init__(self, model):
        self.model = model
        self.device = model.device
        self.cache = DynamicCache(config=model.config)

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    @torch.inference_mode()
    def logits(self, tokens: list[int], keep: int) -> torch.Tensor:
        """Feed tokens[self.length:] and return the logits of the last `keep` positions: [keep, V] float32.

        The positions before those `keep` go through the model without its output layer (`extend`); the head then
        sees exactly the rows it must score. (Asking transformers for the last rows of a longer pass hands the head a
        strided slice, and torch 2.13 then copies the whole bfloat16 head weight on every such call: a 4x slower
        prompt pass, seen on this project's CPUs.)
        """
        self.extend(tokens[: len(tokens) - keep])
        feed = torch.tensor([tokens[self.length:]], device=self.device)
        out = self.model(input_ids=feed, cache=self.cache, use_cache=True, logits_to_keep=feed.shape[1])
        return out.logits[0, -keep:].float()

    @torch.inference_mode()
    def extend(self, tokens: list[int]) -> None:
        """Feed tokens[self.length:] into the cache without computing any logits."""
        if len(tokens) > self.length:
            feed = torch.tensor([tokens[self.length:]], device=self.device)
            self.model.base_model(input_ids=feed, cache=self.cache, use_cache=True)

    def prefill(self, tokens: list[int]) -> None:
        """Feed all of tokens but the last: the prompt's pass, apart from the rounds that follow it. The last token
        is fed with the first step or draft, whose logits it gives."""
        self.extend(tokens[:-1])

    def rollback(self, length: int) -> None:
        """Forget every cached position from `length` on (the rejected tail of a round)."""
        if self.length > length:
            self.cache.crop(length - self.length)


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
    return prompt_ids


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
    trace = Trace("ar", prompt_len=len(tokens))
    start = time.perf_counter()
    target.prefill(tokens)
    trace.prefill_s = time.perf_counter() - start
    new: list[int] = []
    done = False
    while not done:
        t0 = time.perf_counter()
        logits = target.logits(tokens, keep=1)[0]
        token = sample(probs_from_logits(logits, config.temperature), generator)
        emitted, done = _finish([token], config.max_new_tokens - len(new), pair.eos_token_ids)
        tokens += emitted
        new += emitted
        top = logits.topk(min(2, logits.shape[-1])).values.tolist()  # how close a call the greedy token was
        trace.rounds.append(Round(0, 0, token, len(emitted), 0.0, time.perf_counter() - t0, top_logit=top[0],
                                  margin=top[0] - top[-1]))
    trace.wall_s = time.perf_counter() - start
    return new, trace


def draft_tokens(draft: CachedModel, tokens: list[int], u: torch.Tensor, temperature: float, reweight=None):
    """Draft len(u) tokens autoregressively, one uniform each.

    Returns the tokens, the [n, V] distributions q they were drawn from, and the draft's [n, V] logits there.
    reweight(position, logits, q) -> q' lets SSD's Saguaro sampling change q; verify must then see the same q'.
    """
    drafted, q_rows, logit_rows = [], [], []
    for j in range(len(u)):
        logits = draft.logits(tokens + drafted, keep=1)[0]
        q = probs_from_logits(logits, temperature)
        if reweight is not None:
            q = reweight(j, logits, q)
        drafted.append(int(sample_from_uniform(q, u[j])))
        q_rows.append(q)
        logit_rows.append(logits)
    return drafted, q_rows, logit_rows


class Verifier:
    """The target side of SD and SSD: verify a draft, commit what it emits. Lives wherever the target model lives."""

    def __init__(self, target_model, prompt_ids: list[int], config: DecodeConfig, eos_token_ids):
        self.target = CachedModel(target_model)
        self.tokens = list(prompt_ids)
        self.config = config
        self.eos = eos_token_ids
        self.new: list[int] = []
        self.accepted_len = len(prompt_ids)  # the committed prefix both models' caches may keep after a round

    def draft_len(self) -> int:
        """K of the next round: never draft past max_new_tokens (a round yields at most K + 1 tokens)."""
        return min(self.config.k, self.config.max_new_tokens - len(self.new) - 1)

    def verify(self, tokens: list[int], q: torch.Tensor, u_verify: torch.Tensor):
        """Verify one draft; returns the verdict, the tokens it emitted and whether decoding is done."""
        p = probs_from_logits(self.target.logits(self.tokens + tokens, keep=len(tokens) + 1), self.config.temperature)
        verdict = verify(torch.tensor(tokens, dtype=torch.long), q.to(p.device), p, u_verify[:-1], u_verify[-1])
        self.accepted_len = len(self.tokens) + verdict.accepted
        self.target.rollback(self.accepted_len)
        appended = tokens[: verdict.accepted] + [verdict.token]
        emitted, done = _finish(appended, self.config.max_new_tokens - len(self.new), self.eos)
        self.tokens += emitted
        self.new += emitted
        return verdict, emitted, done


def generate_sd(pair, prompt_ids, config: DecodeConfig, generator: torch.Generator):
    """Speculative decoding: K draft tokens, one target pass over K+1 positions, rejection sampling."""
    prompt_ids = check_prompt(pair, prompt_ids, config)
    draft, verifier = CachedModel(pair.draft), Verifier(pair.target, prompt_ids, config, pair.eos_token_ids)
    trace = Trace("sd", prompt_len=len(prompt_ids))
    start = time.perf_counter()
    verifier.target.prefill(prompt_ids)
    draft.prefill(prompt_ids)
    trace.prefill_s = time.perf_counter() - start
    done = False
    while not done:
        k_round = verifier.draft_len()
        t0 = time.perf_counter()
        drafted, q_rows, _ = draft_tokens(draft, verifier.tokens, uniforms(k_round, generator), config.temperature)
        t1 = time.perf_counter()
        q = torch.stack(q_rows) if q_rows else torch.empty(0, pair.vocab_size)
        verdict, emitted, done = verifier.verify(drafted, q, uniforms(k_round + 1, generator))
        # The draft's cache keeps only the accepted prefix too; the appended token t* is fed next round.
        draft.rollback(verifier.accepted_len)
        trace.rounds.append(
            Round(k_round, verdict.accepted, verdict.token, len(emitted), t1 - t0, time.perf_counter() - t1)
        )
    trace.wall_s = time.perf_counter() - start
    return verifier.new, trace
