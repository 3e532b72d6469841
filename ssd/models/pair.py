"""The draft/target pair every method decodes with, and the checks that make two models one pair."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import transformers
from transformers import DynamicCache

from .auto_precision import Precisions, fixed


class ModelLoadError(RuntimeError):
    """A model could not be loaded (the hub unreachable, an unknown id, missing files); the message is one line."""


@dataclass
class Pair:
    draft: transformers.PreTrainedModel
    target: transformers.PreTrainedModel
    tokenizer: object  # a transformers tokenizer, or ssd.models.tiny.ToyTokenizer
    name: str
    eos_token_ids: tuple[int, ...] = ()
    # What builds this pair again in another process (ssd.pipeline.launch's drafter rank loads its own draft): a name
    # for load_pair / load_draft, or a picklable zero-argument callable returning the same Pair. None: unknown.
    source: object = None
    # What each model runs at and why (ssd.models.auto_precision.Precisions); recorded with every measurement.
    precisions: Precisions = field(default_factory=lambda: fixed("float32", "float32", why="loaded as given"))
    # How both models' forwards run (ssd.models.forwards): eager or compiled; recorded with every measurement.
    forward: str = "eager"
    # The two-rank pipeline generate_ssd_pipeline keeps for this pair between calls (a
    # ssd.pipeline.launch.Pipeline, which sets and clears it; close_pipeline(pair) closes it), None while there is
    # none. On the pair, so that two pairs never share a drafter; not an argument, so dataclasses.replace gives the
    # copy none of its own.
    pipeline: object = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        # Speculative sampling compares the two models' distributions index by index: one vocabulary or nothing.
        check_same_vocab_size(self.draft, self.target, _model_name(self.draft), _model_name(self.target))

    @property
    def vocab_size(self) -> int:
        return self.target.config.vocab_size

    @property
    def max_context(self) -> int:
        return min(_max_positions(self.draft.config), _max_positions(self.target.config))

    @functools.cached_property
    def attention_window(self) -> tuple[int, str] | None:
        """(window, model name) of the smaller sliding (or chunked) attention window of the two models, or None where
        every layer of both attends to the whole context. Such a layer's cache keeps only the last window - 1 tokens
        once the window fills, and cannot then be cut back after a rejection: speculation decodes within it
        (ssd.core.decoding.check_prompt)."""
        windows = [(w, _model_name(m)) for m in (self.draft, self.target) if (w := sliding_window(m)) is not None]
        return min(windows) if windows else None


def sliding_window(model) -> int | None:
    """The smallest attention window among the model's layers, read off the cache transformers builds for its config
    (sliding and chunked attention alike), or None where every layer sees the whole context."""
    layers = DynamicCache(config=model.config).layers
    windows = [int(layer.sliding_window) for layer in layers if getattr(layer, "is_sliding", False)]
    return min(windows) if windows else None


def _model_name(model) -> str:
    return getattr(model.config, "name_or_path", "") or type(model).__name__


def _max_positions(config) -> int:
    for key in ("max_position_embeddings", "n_positions"):
        if getattr(config, key, None):
            return int(getattr(config, key))
    raise ValueError(f"{type(config).__name__} gives no max_position_embeddings or n_positions")


def check_same_vocab_size(draft, target, draft_name: str, target_name: str) -> None:
    d, t = draft.config.vocab_size, target.config.vocab_size
    if d != t:
        raise ValueError(f"draft {draft_name} has vocab_size {d} but target {target_name} has vocab_size {t}: "
                         "a draft/target pair needs one vocabulary")


def check_same_tokenizer(draft_tok, target_tok, draft_name: str, target_name: str) -> None:
    """Raise ValueError unless both tokenizers map the same strings to the same ids, special tokens included."""
    dv, tv = draft_tok.get_vocab(), target_tok.get_vocab()
    if dv != tv:
        differ = sorted(k for k in dv.keys() | tv.keys() if dv.get(k) != tv.get(k))
        raise ValueError(f"draft {draft_name} and target {target_name} have different tokenizers: vocabularies of "
                         f"{len(dv)} and {len(tv)} tokens, {len(differ)} differ (e.g. {differ[:5]})")
    ds, ts = draft_tok.special_tokens_map, target_tok.special_tokens_map
    if ds != ts:
        raise ValueError(f"draft {draft_name} and target {target_name} have different special tokens: {ds} vs {ts}")


def eos_ids(model, tokenizer=None, extra_tokens=()) -> tuple[int, ...]:
    """Every id that ends generation, in order of first mention: generation config, model config, tokenizer."""
    found = []
    tok_ids = [tokenizer.eos_token_id] if tokenizer is not None else []
    if tokenizer is not None:
        tok_ids += tokenizer.convert_tokens_to_ids(list(extra_tokens))
    for value in (getattr(model.generation_config, "eos_token_id", None),
                  getattr(model.config, "eos_token_id", None), *tok_ids):
        for i in (value if isinstance(value, (list, tuple)) else [value]):
            if isinstance(i, int) and i >= 0 and i not in found:
                found.append(i)
    return tuple(found)


def ready(model, device):
    # Inference only: no autograd graphs, no dropout.
    return model.to(device).eval().requires_grad_(False)
