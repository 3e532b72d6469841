"""The static KV cache (issue 56): preallocated in buckets, written in place, rolled back by moving a pointer; and in
fixed shapes (attention over the whole bucket, batches and tree branches in row buckets) every method's tokens and
rounds equal the eager reference's (attention over the slots in use, a DynamicCache's shapes)."""
import pytest
import torch
import torch.nn.functional as F

from ssd.bench.methods import METHODS
from ssd.core import cached_model
from ssd.core.cached_model import CachedModel
from ssd.core.decoding import DecodeConfig
from ssd.core.speculation import SSDConfig
from ssd.core.static_cache import MIN_SLOTS, bucket, rows_bucket
from ssd.models.tiny import tiny_pair

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 1, 2], [3]]  # ragged: 3 rows, computed as a bucket of 4


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab_size=32, agreement_noise=0.4, seed=1)


def test_buckets_are_powers_of_two():
    assert [bucket(n) for n in (0, 1, MIN_SLOTS, MIN_SLOTS + 1, 300)] == [MIN_SLOTS, MIN_SLOTS, MIN_SLOTS,
                                                                           2 * MIN_SLOTS, 512]
    assert [rows_bucket(n) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, 16]


def test_steps_write_in_place_and_a_rollback_moves_the_pointer(pair):
    model = CachedModel(pair.target)
    model.prefill([1, 2, 3, 4, 5])
    keys = model.cache.layers[0].keys
    address = keys.data_ptr()
    assert keys.shape[2] == MIN_SLOTS and model.cache.get_seq_length() == 4
    model.logits([1, 2, 3, 4, 5, 6, 7], keep=1)
    model.rollback(5)  # the rejected tail: the pointer moves back, nothing is copied
    assert model.cache.get_seq_length() == model.slots == 5
    assert model.cache.layers[0].keys.data_ptr() == address
    ids = list(range(1, 16)) * 6  # past the first bucket: copied once into the next, the prefix kept
    before = model.cache.layers[0].keys[:, :, :5].clone()
    model.logits(ids[:90], keep=1)
    assert model.cache.capacity == 2 * MIN_SLOTS and model.cache.get_seq_length() == 90
    assert torch.equal(model.cache.layers[0].keys[:, :, :5], before)


def test_attention_reads_the_whole_bucket_and_the_reference_only_the_slots_in_use(pair, monkeypatch):
    real, seen = F.scaled_dot_product_attention, []

    def spy(q, k, v, attn_mask=None, **kw):
        seen.append((k.shape[2], None if attn_mask is None else attn_mask.shape[-1]))
        return real(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    for fixed, slots in ((True, MIN_SLOTS), (False, 7)):
        seen.clear()
        model = CachedModel(pair.target, fixed_shapes=fixed)
        model.prefill([1, 2, 3, 4, 5, 6])
        model.logits([1, 2, 3, 4, 5, 6, 7], keep=1)
        assert seen[-1][0] == slots and seen[-1][1] in (slots, None)


def test_a_batch_is_a_bucket_of_rows_and_a_retired_row_leaves_it_when_a_smaller_bucket_holds_the_rest(pair):
    model = CachedModel(pair.target, rows=3, fixed_shapes=True)
    model.extend({0: [1, 2, 3], 1: [4, 5], 2: [6]})
    assert model.batch == 4 and model.cache.layers[0].keys.shape[0] == 4 and model.valid.shape[0] == 3
    address = model.cache.layers[0].keys.data_ptr()
    model.retire(1)  # 2 rows left: a bucket of 2
    assert model.batch == 2 and model.cache.layers[0].keys.shape[0] == 2 and model.rows == [0, 2]
    logits = model.logits({0: [1, 2, 3, 9], 2: [6, 8]}, keep=1)
    for row, seq in ((0, [1, 2, 3, 9]), (2, [6, 8])):
        torch.testing.assert_close(logits[row], CachedModel(pair.target).logits(seq, keep=1), atol=1e-5, rtol=1e-5)
    four = CachedModel(pair.target, rows=4, fixed_shapes=True)
    four.extend({r: [r + 1] * (r + 1) for r in range(4)})
    address = four.cache.layers[0].keys.data_ptr()
    four.retire(0)  # 3 rows left: still a bucket of 4, the rows moved within the same buffers
    assert four.batch == 4 and four.cache.layers[0].keys.data_ptr() == address
    logits = four.logits({r: [r + 1] * (r + 1) + [7] for r in (1, 2, 3)}, keep=1)
    for r in (1, 2, 3):
        alone = CachedModel(pair.target).logits([r + 1] * (r + 1) + [7], keep=1)
        torch.testing.assert_close(logits[r], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name,config", [
    ("sd", DecodeConfig(k=3, max_new_tokens=16)),
    ("ssd", SSDConfig(k=3, budget=6, max_new_tokens=16)),
    ("ssd", SSDConfig(k=3, budget=5, temperature=0.8, max_new_tokens=16)),
])
def test_fixed_shapes_give_the_references_tokens_and_rounds(pair, monkeypatch, name, config):
    """A ragged batch of 3 (a dead 4th row), holes, retired rows and SSD's tree (its branches a bucket too)."""
    runs = []
    for fixed in (False, True):
        monkeypatch.setattr(cached_model, "FIXED_SHAPES", fixed)
        tokens, traces = METHODS[name](pair, PROMPTS, config, torch.Generator().manual_seed(0))
        runs.append((tokens, [[(r.accepted, r.token, getattr(r, "hit", None)) for r in t.rounds] for t in traces]))
    assert runs[0] == runs[1]


def test_the_reference_is_a_dynamic_caches_forward_bit_for_bit(pair):
    """Without fixed shapes attention reads a view of the slots in use: the eager forward of a DynamicCache, exactly
    (fixed shapes move float32 logits by about 1e-6: a wider softmax row; the tokens above stay the same)."""
    from transformers import DynamicCache

    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7]])
    cache = DynamicCache(config=pair.target.config)
    with torch.inference_mode():
        pair.target.base_model(input_ids=ids[:, :4], cache=cache, use_cache=True)
        cache.crop(-1)  # a rollback
        expected = pair.target(input_ids=ids[:, 3:], cache=cache, use_cache=True,
                               logits_to_keep=torch.arange(2, 4)).logits[0].float()
    model = CachedModel(pair.target, fixed_shapes=False)
    model.extend(ids[0, :4].tolist())
    model.rollback(3)
    assert torch.equal(model.logits(ids[0].tolist(), keep=2), expected)


def test_a_forward_writes_at_the_slots_placed_on_the_device_at_one_address_per_width(pair):
    model = CachedModel(pair.target)
    model.prefill([1, 2, 3, 4, 5])
    model.logits([1, 2, 3, 4, 5, 6], keep=1)  # 5 and 6: a block of 2 at slots 4 and 5
    assert model.cache.index[2].tolist() == [4, 5] and all(layer.placed is None for layer in model.cache.layers)
    model.logits([1, 2, 3, 4, 5, 6, 7], keep=1)
    index = model.cache.index[1]
    model.logits([1, 2, 3, 4, 5, 6, 7, 8], keep=1)
    assert model.cache.index[1] is index and index.tolist() == [7]  # refilled in place
