"""A causal LM and its KV cache, kept across the rounds of one generate call.

The invariant every loop keeps: the cache holds a prefix of ``tokens`` (prompt + output so far), and a forward feeds
exactly the tokens the cache lacks. After a rejection the cache is cropped back to the accepted prefix, so the prompt
is encoded once and never again.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache


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
        feed = torch.tensor([tokens[self.length:]], device=self.device)  # [1, keep]
        out = self.model(input_ids=feed, cache=self.cache, use_cache=True, logits_to_keep=feed.shape[1])
        return out.logits[0, -keep:].float()

    @torch.inference_mode()
    def extend(self, tokens: list[int]) -> None:
        """Feed tokens[self.length:] into the cache without computing any logits."""
        if len(tokens) > self.length:
            feed = torch.tensor([tokens[self.length:]], device=self.device)  # [1, new]
            self.model.base_model(input_ids=feed, cache=self.cache, use_cache=True)

    def prefill(self, tokens: list[int]) -> None:
        """Feed all of tokens but the last: the prompt's pass, apart from the rounds that follow it. The last token
        is fed with the first step or draft, whose logits it gives."""
        self.extend(tokens[:-1])

    def rollback(self, length: int) -> None:
        """Forget every cached position from `length` on (the rejected tail of a round)."""
        if self.length > length:
            self.cache.crop(length - self.length)
