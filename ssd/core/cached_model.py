"""A causal LM and the KV cache of a batch of sequences, kept across the rounds of one generate call.

The invariant every loop keeps: for each sequence (a *row* of the batch) the cache holds a prefix of its tokens
(prompt + output so far), and a forward feeds each row exactly the tokens its cache lacks. After a rejection the row
forgets its rejected tail, so a prompt is encoded once and never again.

Batching (b rows in one forward; b = 1 is a batch of one, today's single sequence):

- one static KV cache (``ssd.core.static_cache``): [b, heads, capacity, dim] per layer, preallocated in buckets and
  written in place, of which the first L slots are in use; and ``valid`` [b, L]: which of those slots hold a token of
  the row. A forward feeds every row the tokens it lacks, right-aligned in a block as wide as the longest such run;
  a shorter row's leading slots in the block are padding. So ragged prompts are left-padded, and a row that accepted
  fewer tokens than its neighbours is padded in the next forward.
- a rollback marks the row's rejected slots invalid (they become *holes*, masked); slots no row uses at the end are
  cropped (the cache's write pointer moves back: nothing is copied), and once compacting would shorten the cache by a
  quarter the rows are compacted (each row's valid slots gathered to the right, in place). With one row every invalid
  slot is at the end, so a rollback is a crop, as it always was.
- where any slot is invalid the forward gets a 4D attention mask (each slot sees the row's valid slots up to itself,
  and itself, so a padding slot never attends to nothing) and position ids that count each row's valid slots: every
  row sees the positions and context it would have alone. Where none is, neither is passed (b = 1 runs exactly as
  before batching), unless the forward runs in fixed shapes (``fixed_shapes``, for compiled forwards): attention then
  reads the cache's whole bucket, and the mask (always passed, as wide as the bucket) marks the slots past L invalid.
- in fixed shapes the batch is a bucket too (``static_cache.rows_bucket``: 1, 2, 4, 8, ...): 3 rows are computed as
  4, the last a dead row (fed id 0, seeing only itself, its logits never read).
- ``retire(row)`` takes a finished sequence out of the batch: it stops costing work once the rows left fit a smaller
  batch bucket (at once, without fixed shapes); until then its place is a dead row.

Rows are named by their index in the batch they started in; the cache's own order is an internal matter.
"""
from __future__ import annotations

import torch
from .static_cache import SlotCache, rows_bucket

COMPACT_FRACTION = 0.25  # compact once that shortens the cache by this share: attention over holes is waste
# The default of CachedModel(fixed_shapes=...). True: attention over the cache's whole bucket, with a mask always, and
# rows and tree branches in buckets (the shapes a compiled forward needs; float32 logits move by about 1e-6, the tokens
# of every identity test and golden.json stay). False: over the slots in use, without a mask where none is invalid (a
# DynamicCache's forward, bit for bit: the eager reference). False unless the model says it needs them (a compiled
# forward, ssd.models.forwards, sets its `fixed_shapes` attribute): eager, the bucket's extra slots and dead rows cost
# 5-10% at short contexts and buy nothing.
FIXED_SHAPES = False


class CachedModel:
    """A causal LM and its KV cache, which always covers a prefix of each row's sequence."""

    def __init__(self, model, rows: int = 1, fixed_shapes: bool | None = None):
        self.model = model
        self.device = model.device
        if fixed_shapes is None:  # a compiled forward (ssd.models.forwards) says it needs them: a graph holds shapes
            fixed_shapes = getattr(model, "fixed_shapes", FIXED_SHAPES)
        self.fixed_shapes = fixed_shapes
        self.cache = SlotCache(model.config, self.fixed_shapes, device=self.device)
        self.rows = list(range(rows))  # the rows still in the batch, in the cache's order
        self.batch = self._bucket(rows)  # rows computed per forward: the live ones first, then dead ones
        self.valid = torch.zeros(rows, 0, dtype=torch.bool)  # [b, L] on the CPU: which slots hold a row's token
        self.lengths = [0] * rows  # tokens each row holds (its count of valid slots), by row

    def length(self, row: int = 0) -> int:
        """How many of `row`'s tokens the cache holds."""
        return self.lengths[row]

    def _bucket(self, rows: int) -> int:
        return rows_bucket(rows) if self.fixed_shapes else rows

    def padded(self, live: torch.Tensor) -> torch.Tensor:
        """A [b, ...] tensor over the live rows as [batch, ...]: the dead rows' entries zero (False)."""
        if live.shape[0] == self.batch:
            return live
        return torch.cat([live, live.new_zeros(self.batch - live.shape[0], *live.shape[1:])])

    @property
    def slots(self) -> int:
        """L: the cache's slots per row, valid or not (where SSD's token tree is appended)."""
        return self.valid.shape[1]

    @torch.inference_mode()
    def logits(self, tokens, keep):
        """Feed each row tokens[length:] in one forward and return the logits of its last `keep` positions, float32.

        tokens: one row's list (row 0) -> [keep, V]; or {row: list} (keep an int or {row: int}) -> {row: [keep, V]}.
        The output layer sees only the slots it must score, gathered by index (a contiguous copy): asking
        transformers for the last rows of a longer pass by count hands the head a strided slice, and torch 2.13 then
        copies the whole bfloat16 head weight on every such call (a 4x slower prompt pass, seen on this project's
        CPUs).
        """
        single = not isinstance(tokens, dict)
        if single:
            tokens, keep = {0: tokens}, {0: keep}
        elif isinstance(keep, int):
            keep = dict.fromkeys(tokens, keep)
        feeds = {row: seq[self.lengths[row]:] for row, seq in tokens.items()}
        logits = self._forward(feeds, keep=max(keep.values()))  # [b, keep, V], right-aligned: a row's last slot last
        out = {row: logits[self.rows.index(row), logits.shape[1] - keep[row]:].float() for row in tokens}
        return out[0] if single else out

    @torch.inference_mode()
    def extend(self, tokens) -> None:
        """Feed each row tokens[length:] without computing any logits. tokens: a list (row 0) or {row: list}."""
        tokens = tokens if isinstance(tokens, dict) else {0: tokens}
        feeds = {row: seq[self.lengths[row]:] for row, seq in tokens.items() if len(seq) > self.lengths[row]}
        if feeds:
            self._forward(feeds, keep=0)

    def prefill(self, tokens) -> None:
        """Feed all of each row's tokens but the last: the prompt's pass, apart from the rounds that follow it. The
        last token is fed with the first step or draft, whose logits it gives. tokens: a list (row 0) or {row: list}."""
        tokens = tokens if isinstance(tokens, dict) else {0: tokens}
        self.extend({row: seq[:-1] for row, seq in tokens.items()})

    def _forward(self, feeds: dict[int, list[int]], keep: int):
        """One forward over every row of the batch (rows not in `feeds`, and short ones, get padding slots), and the
        logits of the block's last `keep` slots ([b, keep, V]; keep 0: none, the model without its output layer)."""
        width = max(len(seq) for seq in feeds.values())
        b, base = self.batch, self.slots
        ids = torch.zeros(b, width, dtype=torch.long)  # [b, width] right-aligned feeds; id 0 in padding slots
        fed = torch.zeros(b, width, dtype=torch.bool)  # [b, width] which slots of the block hold a token
        for row, seq in feeds.items():
            i = self.rows.index(row)
            ids[i, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
            fed[i, width - len(seq):] = True
        valid = torch.cat([self.padded(self.valid), fed], dim=1)  # [b, L + width]
        self.cache.reserve(base + width)  # the bucket the block lands in, before the mask is made as wide
        self.cache.place(width)
        masking = {}
        if self.fixed_shapes or not valid.all():
            # [b, width] each row's own positions (contiguous: a graph's guards hold its inputs' strides too)
            positions = (valid.cumsum(1) - 1).clamp(min=0)[:, base:].clone(memory_format=torch.contiguous_format)
            masking = dict(attention_mask=self._mask(valid, width), position_ids=positions.to(self.device))
        model = self.model if keep else self.model.base_model
        scored = dict(logits_to_keep=torch.arange(width - keep, width, device=self.device)) if keep else {}
        out = model(input_ids=ids.to(self.device), cache=self.cache, use_cache=True, **scored, **masking)
        self.valid = valid[: len(self.rows)]
        for row, seq in feeds.items():
            self.lengths[row] += len(seq)
        return out.logits if keep else None

    def _mask(self, valid: torch.Tensor, width: int) -> torch.Tensor:
        """The additive [b, 1, width, S] mask of a block of `width` slots after L cached ones (S: the bucket in fixed
        shapes, else L + width)."""
        total = valid.shape[1]
        slot = torch.arange(total)  # [L + width]
        query = torch.arange(total - width, total)  # [width] the block's slots
        sees = valid[:, None, :] & (slot[None, None, :] <= query[None, :, None])  # [b, width, L + width]
        sees |= slot[None, None, :] == query[None, :, None]  # itself: a padding slot must attend to something
        return additive_mask(self.widen(sees), self.model.dtype)[:, None].to(self.device)

    def widen(self, sees: torch.Tensor) -> torch.Tensor:
        """A visibility [..., n] over the first n slots as wide as attention reads: in fixed shapes the whole bucket
        (the slots from n on unseen), else as it is."""
        if not self.fixed_shapes or sees.shape[-1] == self.cache.capacity:
            return sees
        return torch.nn.functional.pad(sees, (0, self.cache.capacity - sees.shape[-1]), value=False)

    @torch.inference_mode()  # valid is an inference tensor (made in a forward): updated in that mode
    def rollback(self, length: int, row: int = 0) -> None:
        """Forget every cached token of `row` from its `length`-th on (the rejected tail of a round)."""
        if self.lengths[row] <= length:
            return
        i = self.rows.index(row)
        self.valid[i] &= self.valid[i].cumsum(0) <= length
        self.lengths[row] = length
        self._tidy()

    @torch.inference_mode()
    def truncate(self, slots: int) -> None:
        """Drop every slot from `slots` on, in all rows (SSD's token tree too, fed past the slots `valid` tracks): the
        cache's write pointer moves back, and the next forward overwrites them."""
        extra = self.cache.get_seq_length() - slots
        if extra > 0:
            self.cache.crop(-extra)
        self.valid = self.valid[:, :slots]

    @torch.inference_mode()
    def retire(self, row: int) -> None:
        """Take a finished row out of the batch: later forwards no longer compute it."""
        keep = [i for i, r in enumerate(self.rows) if r != row]
        if len(keep) == len(self.rows):
            return
        if keep:  # (the last row's cache is simply left: nothing computes it again)
            self.batch = self._bucket(len(keep))
            dead = [len(self.rows) - 1] * (self.batch - len(keep))  # any row: a dead row's slots are never seen
            self.cache.select_rows(torch.tensor(keep + dead, dtype=torch.long, device=self.device))
        self.valid = self.valid[keep]
        self.rows.remove(row)
        self._tidy()

    def _tidy(self) -> None:
        """Crop the slots no row uses at the end; compact the rows once that would shorten the cache by more than
        COMPACT_FRACTION (the longest row bounds it: a ragged batch's left padding stays whatever is done)."""
        used = self.valid.any(0).nonzero()
        self.truncate(int(used[-1]) + 1 if len(used) else 0)
        longest = max((self.lengths[row] for row in self.rows), default=0)
        if self.slots - longest > COMPACT_FRACTION * self.slots:
            self.compact()

    @torch.inference_mode()  # the cache's buffers are inference tensors: written in place in that mode
    def compact(self) -> None:
        """Gather each row's valid slots to the right of a cache as long as the longest row: no holes are left,
        only the shorter rows' left padding. Keys keep their positions (they were rotated when they were fed)."""
        width = int(self.valid.sum(1).max())
        index = torch.zeros(len(self.rows), width, dtype=torch.long)  # [b, width] the slot each new slot copies
        valid = torch.zeros(len(self.rows), width, dtype=torch.bool)  # [b, width]
        for i in range(len(self.rows)):
            kept = self.valid[i].nonzero()[:, 0]
            index[i, width - len(kept):] = kept
            valid[i, width - len(kept):] = True
        self.cache.gather_slots(self.padded(index).to(self.device))  # in place, within the bucket
        self.valid = valid


def additive_mask(sees: torch.Tensor, dtype) -> torch.Tensor:
    """A boolean visibility (True: attend) as the additive mask transformers adds to the scores, in the model's
    dtype."""
    return torch.zeros(sees.shape, dtype=dtype, device=sees.device).masked_fill_(~sees, torch.finfo(dtype).min)
