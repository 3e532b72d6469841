"""Tiny random pairs: two small Qwen2 models with a tunable draft/target agreement, built in milliseconds, and a
stand-in tokenizer. What the tests and the notebooks' quick runs (pair_name="tiny") use."""
from __future__ import annotations

import functools

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from ..names import TINY_PAIR
from .pair import Pair, ready



def _tiny_config(vocab_size, hidden_size, num_layers, max_context, init_std) -> Qwen2Config:
    return Qwen2Config(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
                       num_attention_heads=4, num_key_value_heads=2, intermediate_size=2 * hidden_size,
                       max_position_embeddings=max_context, tie_word_embeddings=False, initializer_range=init_std,
                       bos_token_id=None, eos_token_id=None, pad_token_id=None)


def _random_weights(model, generator, init_std, logit_scale) -> dict[str, torch.Tensor]:
    """Gaussian weights for every matrix and bias; RMSNorm gains stay at one.

    The final norm gives the lm_head unit-RMS inputs, so lm_head std logit_scale/sqrt(hidden) makes the logits'
    std about logit_scale: that, not the vocabulary size, sets how peaked the next-token distributions are.
    """
    weights = {}
    for name, p in model.named_parameters():
        if "norm" in name:
            continue
        std = logit_scale / p.shape[1] ** 0.5 if name.startswith("lm_head") else init_std
        weights[name] = torch.randn(p.shape, generator=generator) * std
    return weights


class ToyTokenizer:
    """A tiny pair's stand-in tokenizer: one id per character (code point mod V), shown back as <id>. It lets every
    notebook and prompt set run on a tiny pair in seconds; the text it makes means nothing."""

    chat_template = None

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [ord(c) % self.vocab_size for c in text][-64:]}  # the tail: tiny models have short contexts

    def decode(self, ids, **_) -> str:
        return "".join(f"<{int(i)}>" for i in ids)


def tiny_pair(*, vocab_size=16, agreement_noise=0.1, seed=0, hidden_size=32, num_layers=2, max_context=256,
              logit_scale=2.5, init_std=0.1) -> Pair:
    """Two tiny random Qwen2 models on one vocabulary, float32, CPU, deterministic for a seed.

    The draft's weights are (1 - agreement_noise) * target + agreement_noise * independent noise (same scale), so
    agreement_noise=0 gives a draft identical to the target and 1 an unrelated one: greedy agreement between them
    (and the speculative acceptance rate) falls as the noise rises. The default 0.1 gives acceptance rates of about
    0.3-0.9 (0.3 gave about 0.05: every method took one round a token, and K or the temperature changed nothing). A
    large init_std lets attention mix the whole context, so next-token distributions depend on more than the last token.
    """
    if not 0.0 <= agreement_noise <= 1.0:
        raise ValueError(f"agreement_noise must lie in [0, 1], got {agreement_noise}")
    config = _tiny_config(vocab_size, hidden_size, num_layers, max_context, init_std)
    with torch.random.fork_rng(devices=[]):  # building a model draws from the global RNG; leave the caller's alone
        target, draft = Qwen2ForCausalLM(config), Qwen2ForCausalLM(config)
    generator = torch.Generator().manual_seed(seed)
    target_w = _random_weights(target, generator, init_std, logit_scale)
    noise_w = _random_weights(draft, generator, init_std, logit_scale)
    with torch.no_grad():
        for name, p in target.named_parameters():
            if name in target_w:
                p.copy_(target_w[name])
        for name, p in draft.named_parameters():
            if name in target_w:
                p.copy_((1 - agreement_noise) * target_w[name] + agreement_noise * noise_w[name])
    target.config.name_or_path, draft.config.name_or_path = "tiny-target", "tiny-draft"
    source = functools.partial(tiny_pair, vocab_size=vocab_size, agreement_noise=agreement_noise, seed=seed,
                               hidden_size=hidden_size, num_layers=num_layers, max_context=max_context,
                               logit_scale=logit_scale, init_std=init_std)
    return Pair(ready(draft, "cpu"), ready(target, "cpu"), ToyTokenizer(vocab_size), TINY_PAIR, (), source)
