"""ssd.models.kernels: float32 layers multiplied through oneDNN where it is faster. The layer computes what nn.Linear
does (to float32 rounding), a model keeps its weights and state dict, the choice follows the measured times, and
decoding through the swapped layers stays lossless: every row of a ragged batch equals AR alone."""
import pytest
import torch
import torch.nn.functional as F

from ssd.models import kernels
from ssd.core.decoding import DecodeConfig, generate_ar
from ssd.bench.methods import METHODS
from ssd.models.tiny import tiny_pair
from ssd.models.precision import convert
from ssd.bench.profile import profile_path
from ssd.core.speculation import SSDConfig

needs_onednn = pytest.mark.skipif(not kernels.available(), reason="this torch has no oneDNN linear")
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 1, 2], [3], [7, 7, 7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [2, 4]]


@pytest.fixture
def pair():
    return tiny_pair(vocab_size=32, agreement_noise=0.4, seed=1)


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 1, 48), (3, 5, 48), (7, 48)])
def test_the_onednn_layer_computes_what_linear_does(bias, shape):
    torch.manual_seed(0)
    layer = torch.nn.Linear(48, 40, bias=bias)
    x = torch.randn(*shape)
    expected = F.linear(x, layer.weight, layer.bias)
    layer.__class__ = kernels.OneDNNLinear
    with torch.inference_mode():
        got = layer(x)
        strided = layer(torch.randn(48, *shape[:-1]).movedim(0, -1))  # a non-contiguous input (a transposed view)
    assert got.shape == expected.shape and strided.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_training_keeps_torchs_product_and_its_gradient():
    layer = torch.nn.Linear(8, 4)
    layer.__class__ = kernels.OneDNNLinear
    layer(torch.randn(2, 8)).sum().backward()  # oneDNN's op has no backward: the layer falls back to F.linear
    assert layer.weight.grad is not None and layer.weight.grad.shape == (4, 8)


def test_use_onednn_swaps_only_float32_linears_and_keeps_the_weights(pair):
    before = {k: v.clone() for k, v in pair.target.state_dict().items()}
    linears = [m for m in pair.target.modules() if type(m) is torch.nn.Linear]
    kernels.use_onednn(pair.target)
    assert kernels.library_of(pair.target) == "onednn"
    assert all(type(m) is kernels.OneDNNLinear for m in linears)
    after = pair.target.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    kernels.use_torch(pair.target)
    assert kernels.library_of(pair.target) == "torch" and all(type(m) is torch.nn.Linear for m in linears)
    quantized = convert(pair.draft, "int8")
    assert kernels.float32_linears(quantized) == []  # int8's packed layers are not the choice's concern
    assert kernels.choose(quantized) is None and kernels.library_of(quantized) == "torch"


@pytest.mark.parametrize("torch_ms, onednn_ms, chosen", [(10.0, 8.9, "onednn"), (10.0, 9.5, "torch"),
                                                         (10.0, 12.0, "torch")])
def test_onednn_is_chosen_only_when_it_is_margin_faster(monkeypatch, pair, torch_ms, onednn_ms, chosen):
    if not kernels.available():
        pytest.skip("this torch has no oneDNN linear")
    calls = iter([torch_ms / 2, onednn_ms / 2] * len(kernels.ROWS))  # each library's time, at each row count in turn
    monkeypatch.setattr(kernels, "_fastest_ms", lambda call: next(calls))
    kernels._decisions.clear()
    try:
        decision = kernels.choose(pair.target)
        recorded = decision in kernels.decisions()  # what a bench JSON records
    finally:  # the made-up times leave no decision behind
        kernels._decisions.clear()
    assert decision["library"] == chosen and decision["ms"] == {"torch": torch_ms, "onednn": onednn_ms}
    assert kernels.library_of(pair.target) == chosen and recorded


@needs_onednn
@pytest.mark.parametrize("name", ["sd", "ssd"])
def test_every_row_of_a_batch_through_onednn_equals_ar_alone(pair, name):
    kernels.use_onednn(pair.target)
    kernels.use_onednn(pair.draft)
    config = SSDConfig(k=3, budget=4, max_new_tokens=24) if name == "ssd" else DecodeConfig(k=4, max_new_tokens=24)
    alone = [generate_ar(pair, p, DecodeConfig(max_new_tokens=24), torch.Generator().manual_seed(0))[0]
             for p in PROMPTS]
    tokens, _ = METHODS[name](pair, PROMPTS, config, torch.Generator().manual_seed(0))
    assert tokens == alone


def test_a_profile_timed_through_onednn_is_kept_apart(pair):
    torch_path = profile_path(pair, "0", "1")
    kernels.use_onednn(pair.target)
    assert profile_path(pair, "0", "1") != torch_path  # the latencies a tuner prices on depend on the library


def test_a_onednn_that_fails_leaves_torchs_product(monkeypatch, pair):
    calls = []

    def broken(x, weight, bias):
        calls.append(tuple(weight.shape))
        raise RuntimeError("no such primitive")

    monkeypatch.setattr(kernels, "available", lambda: True)
    monkeypatch.setattr(kernels, "onednn_linear", broken)
    kernels._decisions.clear()
    try:
        decision = kernels.choose(pair.target)
        line = kernels.library_line(pair)
        shapes = len(kernels._decisions)
    finally:
        kernels._decisions.clear()
    assert decision["library"] == "torch" and decision["ms"]["onednn"] is None
    assert kernels.library_of(pair.target) == "torch" and "oneDNN unavailable" in line
    assert len(calls) == shapes  # tried once a shape: after a failure the larger row counts are not tried again
