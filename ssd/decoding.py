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

from .sampling import check_temperature, probs_from_logits, sample, uniforms
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
        """Feed tokens[self.length:] and return the logits of the last `keep` positions: [keep, V] float32."""
        feed = torch.tensor([tokens[self.length:]], device=self.device)
        out = self.model(input_ids=feed, cache=self.cache, use_cache=True, logits_to_keep=keep)
        return out.logits[0, -keep:].float()

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
    new: list[int] = []
    done = False
    while not done:
        t0 = time.perf_counter()
        token = sample(probs_from_logits(target.logits(tokens, keep=1)[0], config.temperature), generator)
        emitted, done = _finish([token], config.max_new_tokens - len(new), pair.eos_token_ids)
        tokens += emitted
        new += emitted
        trace.rounds.append(Round(0, 0, token, len(emitted), 0.0, time.perf_counter() - t0))
    trace.wall_s = time.perf_counter() - start
    return new, trace


def draft_tokens(draft: CachedModel, tokens: list[int], n: int, temperature: float, generator: torch.Generator):
    """Draft n tokens autoregressively; returns them and the [n, V] distributions they were drawn from."""
    drafted, q_rows = [], []
    for _ in range(n):
        q = probs_from_logits(draft.logits(tokens + drafted, keep=1)[0], temperature)
        drafted.append(sample(q, generator))
        q_rows.append(q)
    return drafted, q_rows


def generate_sd(pair, prompt_ids, config: DecodeConfig, generator: torch.Generator):
    """Speculative decoding: K draft tokens, one target pass over K+1 positions, rejection sampling."""
    tokens = check_prompt(pair, prompt_ids, config)
    draft, target = CachedModel(pair.draft), CachedModel(pair.target)
    trace = Trace("sd", prompt_len=len(tokens))
    start = time.perf_counter()
    new: list[int] = []
    done = False
    while not done:
        # Never draft past max_new_tokens: a round yields at most K + 1 tokens.
        k_round = min(config.k, config.max_new_tokens - len(new) - 1)
        t0 = time.perf_counter()
        drafted, q_rows = draft_tokens(draft, tokens, k_round, config.temperature, generator)
        t1 = time.perf_counter()
        p = probs_from_logits(target.logits(tokens + drafted, keep=k_round + 1), config.temperature)
        q = torch.stack(q_rows) if q_rows else p[:0]
        u = uniforms(k_round + 1, generator)
        verdict = verify(torch.tensor(drafted, dtype=torch.long), q.to(p.device), p, u[:-1], u[-1])
        # Both caches now keep only the accepted prefix; the appended token t* is fed next round.
        accepted_len = len(tokens) + verdict.accepted
        target.rollback(accepted_len)
        draft.rollback(accepted_len)
        appended = drafted[: verdict.accepted] + [verdict.token]
        emitted, done = _finish(appended, config.max_new_tokens - len(new), pair.eos_token_ids)
        tokens += emitted
        new += emitted
        trace.rounds.append(
            Round(k_round, verdict.accepted, verdict.token, len(emitted), t1 - t0, time.perf_counter() - t1)
        )
    trace.wall_s = time.perf_counter() - start
    return new, trace
