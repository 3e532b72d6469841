"""Models whose attention slides over a window (Gemma 2, Mistral, ...): their cache drops the oldest tokens once the
window fills and cannot then be cut back after a rejection, nor take SSD's token tree. The kit decodes them exactly
within the window and refuses, in one line naming the model and its window, a request that could pass it."""
import pytest
import torch
import transformers

from ssd.core.decoding import DecodeConfig, generate_ar, generate_sd
from ssd.models.pair import Pair, sliding_window
from ssd.core.speculation import SSDConfig, generate_ssd
from ssd.models.tiny import ToyTokenizer

VOCAB = 32


def tiny(family: str, window: int, noise: float = 0.0) -> transformers.PreTrainedModel:
    torch.manual_seed(0)  # draft and target start from the same weights; the draft then gets noise
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=256, sliding_window=window)
    if family == "gemma2":  # one sliding layer, one full: transformers' hybrid cache
        model = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(head_dim=16, query_pre_attn_scalar=16,
                                                                         **common))
    else:
        model = transformers.MistralForCausalLM(transformers.MistralConfig(**common))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(noise * p.std() * torch.randn_like(p))
    return model.eval()


def pair_of(family: str, window: int) -> Pair:
    return Pair(tiny(family, window, noise=0.1), tiny(family, window), ToyTokenizer(VOCAB), f"tiny-{family}")


def test_the_window_is_read_off_the_cache_transformers_builds():
    assert sliding_window(tiny("gemma2", 48)) == 48 and sliding_window(tiny("mistral", 40)) == 40
    assert sliding_window(tiny("mistral", None)) is None  # Mistral without a window: full attention
    assert pair_of("gemma2", 48).attention_window == (48, "Gemma2ForCausalLM")


@pytest.mark.parametrize("family", ["gemma2", "mistral"])
def test_within_the_window_every_method_is_token_identical_to_the_target(family):
    pair = pair_of(family, 64)
    ids = list(range(1, 6))
    reference, _ = generate_ar(pair, ids, DecodeConfig(max_new_tokens=20), torch.Generator().manual_seed(0))
    sd, _ = generate_sd(pair, ids, DecodeConfig(k=4, max_new_tokens=20), torch.Generator().manual_seed(0))
    ssd, trace = generate_ssd(pair, ids, SSDConfig(k=4, budget=4, max_new_tokens=20), torch.Generator().manual_seed(0))
    assert sd == reference and ssd == reference and len(reference) == 20
    assert any(r.hit for r in trace.rounds)  # the tree's drafts were used, inside the window


@pytest.mark.parametrize("method,config", [
    (generate_ar, DecodeConfig(max_new_tokens=20)),
    (generate_sd, DecodeConfig(k=4, max_new_tokens=20)),
    (generate_ssd, SSDConfig(k=4, budget=4, max_new_tokens=20)),  # fits SD's window, not the tree's branches
])
def test_a_request_that_could_pass_the_window_is_refused_in_one_line(method, config):
    pair = pair_of("gemma2", 64 if method is generate_ssd else 16)
    ids = list(range(1, 30)) if method is generate_ssd else list(range(1, 6))
    with pytest.raises(ValueError, match=r"^Gemma2ForCausalLM attends through a sliding window of (16|64) tokens") as e:
        method(pair, ids, config, torch.Generator().manual_seed(0))
    assert "\n" not in str(e.value)
