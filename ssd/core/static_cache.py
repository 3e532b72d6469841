"""The kit's static KV cache: keys and values preallocated per row, written in place at slot indices.

One ``SlotLayer`` per attention layer holds keys and values of [b, heads, capacity, dim], allocated once and written
by ``index_copy_`` at the slots a forward fills; no torch.cat per step. Those slots are an index on the model's device,
one tensor per block width kept at a fixed address and refilled before each forward (``SlotCache.place``), so a
captured graph replays with the next step's slots. The write pointer ``end`` is where the next forward's block lands
(in fixed shapes ``place`` moves it past the block at once, so that a compiled forward's writes read no Python int
that changes from step to step); moving it back (``crop``) is a rollback: the slots past it stay in memory, stale, and
are overwritten by the next write (``CachedModel.valid`` marks them invalid meanwhile). The capacity is a bucket, a
power of two from MIN_SLOTS up: a cache that outgrows its bucket is copied once into the next one, so a decode of n
tokens reallocates about log2(n / MIN_SLOTS) times, and a compiled forward sees few shapes.

What attention reads (``fixed_shapes``):

- True: the whole bucket, [b, heads, capacity, dim]: a forward's shapes depend only on the bucket and the block width,
  as torch.compile and CUDA graphs need. The caller then always passes a 4D mask as wide as the bucket
  (``CachedModel``'s and ``ssd.core.tree``'s masks are), in which the slots past ``end`` are invalid.
- False: the written slots only, [b, heads, end, dim], a view of the same buffer (no copy): exactly the shapes a
  DynamicCache gives, so the eager forward is today's, bit for bit. The reference the fixed shapes are checked against.

Works for every model whose layers are full or sliding attention (within the window, which the kit never passes, a
sliding layer attends to the whole cache, as transformers' own sliding layers do there).
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, get_layer_types_and_kwargs

MIN_SLOTS = 64  # the smallest bucket; every bucket is a power of two from here
ATTENTION_LAYERS = ("full_attention", "sliding_attention")


def bucket(slots: int) -> int:
    """The capacity that holds `slots`: the smallest power of two >= max(slots, MIN_SLOTS)."""
    return max(MIN_SLOTS, rows_bucket(slots))


def rows_bucket(rows: int) -> int:
    """The rows a fixed-shape forward computes for `rows` live ones (a batch, or the tree's branches per row): the
    smallest power of two >= rows. One compiled graph per bucket, as the official SSD engine keeps one per batch
    bucket."""
    return 1 << max(rows - 1, 0).bit_length()


class SlotLayer(CacheLayerMixin):
    """One attention layer's keys and values, [b, heads, capacity, dim] each, and the write pointer ``end``."""

    is_sliding = False
    is_croppable = True

    def __init__(self, capacity: int, fixed_shapes: bool):
        super().__init__()
        self.capacity, self.fixed_shapes, self.end = capacity, fixed_shapes, 0
        self.placed = None  # the slots of the next block, where the caller placed it (SlotCache.place)
        self.is_compileable = fixed_shapes  # (transformers skips its causal shortcut for compileable caches)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        b, heads = key_states.shape[:2]
        # zeros, not empty: a slot never written is masked, and 0 * a masked slot's value must be 0, never NaN
        self.keys = key_states.new_zeros(b, heads, self.capacity, key_states.shape[-1])
        self.values = value_states.new_zeros(b, heads, self.capacity, value_states.shape[-1])
        self.is_initialized = True
        self._static_addresses()

    def _static_addresses(self) -> None:
        """Tell torch.compile the buffers stay where they are (a CUDA graph may then write them in place), and that
        their heads and head size never change: only rows and capacity are sizes a graph takes as symbols. (Left a
        symbol, a head size of 128 shared one with a bucket of 128, the graph held the bucket at 128 and the next
        bucket traced the model again, 13 s on the offline target.)"""
        if self.fixed_shapes:
            for states in (self.keys, self.values):
                torch._dynamo.mark_static_address(states)
                torch._dynamo.mark_static(states, 1)
                torch._dynamo.mark_static(states, 3)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write the block's keys and values [b, heads, width, dim] at slots end..end + width - 1, in place."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        width = key_states.shape[-2]
        slots, self.placed = self.placed, None  # used once: an unplaced forward writes at end, as its own index
        if self.fixed_shapes and slots is not None:  # place() moved the pointer: no Python int a graph would hold
            self.keys.index_copy_(2, slots, key_states)
            self.values.index_copy_(2, slots, value_states)
            return self.keys, self.values
        self.reserve(self.end + width)
        if slots is None or len(slots) != width:
            slots = torch.arange(self.end, self.end + width, device=self.device)
        self.keys.index_copy_(2, slots, key_states)
        self.values.index_copy_(2, slots, value_states)
        self.end += width
        if self.fixed_shapes:
            return self.keys, self.values
        return self.keys[:, :, : self.end], self.values[:, :, : self.end]

    def reserve(self, slots: int) -> None:
        """Make room for `slots` slots: once past the bucket, copy into the next bucket that holds them."""
        if slots <= self.capacity:
            return
        self.capacity = bucket(slots)
        if self.is_initialized:
            self.keys, self.values = (_grown(states, self.capacity) for states in (self.keys, self.values))
            self._static_addresses()

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return (self.capacity if self.fixed_shapes else self.end + query_length), 0

    def get_seq_length(self) -> int:
        return self.end

    def get_max_length(self) -> int:
        return -1  # grows by buckets

    def crop(self, tokens_to_remove: int) -> None:
        """Move the write pointer back by -tokens_to_remove slots (transformers' sign); the slots stay, stale."""
        self.end = max(self.end + min(tokens_to_remove, 0), 0)

    def reset(self) -> None:
        self.end = 0

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Row i takes row indices[i]: in place where the batch keeps its size (the buffers keep their addresses),
        else into new buffers of len(indices) rows."""
        if not self.is_initialized:
            return
        if len(indices) == self.keys.shape[0]:
            self.keys.copy_(self.keys[indices])
            self.values.copy_(self.values[indices])
        else:
            self.keys, self.values = self.keys[indices], self.values[indices]
            self._static_addresses()

    def gather_slots(self, index: torch.Tensor) -> None:
        """Slot j of row i takes slot index[i, j] (index [b, n], n <= end), in place; the pointer moves to n."""
        if self.is_initialized:
            for states in (self.keys, self.values):
                expanded = index[:, None, :, None].expand(-1, states.shape[1], -1, states.shape[3])
                states[:, :, : index.shape[1]] = states.gather(2, expanded)
        self.end = index.shape[1]


def _grown(states: torch.Tensor, capacity: int) -> torch.Tensor:
    """states [b, heads, C, dim] copied into a zeroed [b, heads, capacity, dim]."""
    out = states.new_zeros(*states.shape[:2], capacity, states.shape[3])
    out[:, :, : states.shape[2]] = states
    return out


class SlotCache(Cache):
    """A static KV cache for `config`'s model: one SlotLayer per attention layer, all with one capacity (a bucket)."""

    def __init__(self, config, fixed_shapes: bool = True, slots: int = 0, device="cpu"):
        types, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
        others = sorted(set(types) - set(ATTENTION_LAYERS))
        if others:
            raise ValueError(f"the static KV cache holds full and sliding attention layers only; this model also has "
                             f"{', '.join(others)}")
        self.fixed_shapes, self.device = fixed_shapes, torch.device(device)
        self.index: dict[int, torch.Tensor] = {}  # block width -> its slots' index, [width] on the device
        super().__init__(layers=[SlotLayer(bucket(slots), fixed_shapes) for _ in types])

    def place(self, width: int) -> torch.Tensor:
        """Before a forward over a block of `width` slots: its slots end..end + width - 1, written into the index
        kept for that width (a fixed address), which every layer's next update writes at."""
        index = self.index.get(width)
        if index is None:
            index = self.index[width] = torch.empty(width, dtype=torch.long, device=self.device)
        end = self.get_seq_length()
        index.copy_(torch.arange(end, end + width))
        if self.fixed_shapes:  # the block's slots are taken now, so the forward's writes need not read the pointer
            self.reserve(end + width)
        for layer in self.layers:
            layer.placed = index
            if self.fixed_shapes:
                layer.end += width
        return index

    @property
    def capacity(self) -> int:
        """Slots per row preallocated (a bucket): in fixed shapes, the width of every mask."""
        return self.layers[0].capacity

    def reserve(self, slots: int) -> None:
        """Make room for `slots` slots per row in every layer (the next bucket, where this one is short)."""
        for layer in self.layers:
            layer.reserve(slots)

    def select_rows(self, indices: torch.Tensor) -> None:
        """Row i takes row indices[i], in every layer (a retired row leaves, or becomes a dead one)."""
        for layer in self.layers:
            layer.batch_select_indices(indices)

    def gather_slots(self, index: torch.Tensor) -> None:
        """Slot j of row i takes slot index[i, j], in every layer (compacting the rows)."""
        for layer in self.layers:
            layer.gather_slots(index)
