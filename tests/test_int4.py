"""The int4 precision (ssd.models.int4): a Q4_K group maps onto torch's int4 layout moved only by the rounding of its
scale and zero, the kernel multiplies by the weights it says, and every method at int4 reproduces int4's own AR."""
import pytest
import torch

from ssd import generate_ar, generate_sd, generate_ssd
from ssd.core.decoding import DecodeConfig
from ssd.core.speculation import SSDConfig
from ssd.models.capability import unsupported_reason
from ssd.models import int4, int4_store, loading
from ssd.models.int4 import GROUP, Int4Linear, dequantize, quantize
from ssd.models.loading import load_pair
from ssd.models.precision import convert, precision_of, weight_bytes
from ssd.models.rescored_logits import RescoredLogits
from ssd.models.tiny import tiny_pair
from tests import test_models

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def q4_k_like(out: int = 64, width: int = 256, seed: int = 0):
    """A weight as a Q4_K file holds it: per group of 32, d * sc * q - dmin * m with q in 0..15 (each group using
    both ends), and the q."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (out, width), generator=g)
    q[:, ::GROUP], q[:, 1::GROUP] = 0, 15
    scale = torch.rand(out, width // GROUP, generator=g) * 0.01 + 0.001  # d * sc
    minimum = torch.rand(out, width // GROUP, generator=g) * 0.05  # dmin * m
    weight = scale.repeat_interleave(GROUP, 1) * q - minimum.repeat_interleave(GROUP, 1)
    return weight.float(), q


def test_a_q4_k_group_keeps_its_levels_and_moves_only_by_the_rounding_of_scale_and_zero():
    weight, q = q4_k_like()
    found, scales_and_zeros = quantize(weight)
    assert (found == q).float().mean() > 0.99  # bfloat16 scale and zero can move a level at a group's far end
    moved = (dequantize(found, scales_and_zeros) - weight).abs().max()
    # a scale and a zero each rounded to bfloat16 (8 bits): at most 2^-8 of (8 x scale) and of |zero| a weight
    assert moved <= 2 ** -8 * (8 * 0.011 + 8 * 0.011 + 0.05)


def test_the_kernel_multiplies_by_the_weights_it_says():
    weight, _ = q4_k_like(out=96, width=128, seed=1)
    linear = torch.nn.Linear(128, 96)
    linear.weight.data = weight
    layer, moved = Int4Linear.from_linear(linear)
    assert moved < 0.02
    x = torch.randn(3, 5, 128).bfloat16()
    q, scales_and_zeros = quantize(weight)
    expected = x.float() @ dequantize(q, scales_and_zeros).t() + linear.bias.bfloat16().float()
    got = layer(x)
    assert got.shape == (3, 5, 96) and got.dtype == torch.bfloat16
    assert ((got.float() - expected).norm() / expected.norm()) < 1e-2


def test_a_target_rescores_its_best_logits_in_float32_and_a_draft_quantizes_its_own_output_layer():
    pair = tiny_pair()
    target = convert(pair.target, "int4", float_logits=True)
    draft = convert(pair.draft, "int4")
    assert isinstance(target.get_output_embeddings(), RescoredLogits)
    assert isinstance(draft.get_output_embeddings(), Int4Linear)
    assert precision_of(target) == precision_of(draft) == "int4"
    assert draft.get_input_embeddings().weight.dtype == torch.bfloat16  # the lookup stays: a tied head is copied
    report = draft.int4_report
    assert report["int4_layers"] == 2 * 7 + 1 and report["kept_bfloat16"] == []


def test_the_rescored_logits_are_float32_where_they_decide_and_int4_elsewhere():
    torch.manual_seed(0)
    head = torch.nn.Linear(64, 1024, bias=False)
    layer = RescoredLogits(head, Int4Linear.from_linear(head)[0])
    hidden = torch.randn(2, 3, 64)
    with torch.no_grad():
        logits, exact = layer(hidden), hidden @ head.weight.t()
    approximate = layer.approximate(hidden.bfloat16()).float()  # what the int4 layer alone gives
    top = approximate.topk(RescoredLogits.CANDIDATES, dim=-1).indices
    # the candidates: float32, as FloatLogits computes them (another summation order: 1e-7)
    torch.testing.assert_close(logits.gather(-1, top), exact.gather(-1, top), rtol=1e-6, atol=1e-6)
    rest = torch.ones_like(logits, dtype=torch.bool).scatter(-1, top, False)
    assert torch.equal(logits[rest], approximate[rest])  # the rest: the int4 layer's
    assert torch.equal(logits.argmax(-1), exact.argmax(-1))


def test_a_layer_whose_width_is_not_a_multiple_of_the_group_stays_bfloat16():
    model = tiny_pair(hidden_size=48).draft  # 48 = 1.5 groups: every layer reading the hidden state
    report = convert(model, "int4").int4_report
    assert report["kept_bfloat16"] and all(isinstance(m, torch.nn.Linear) for name, m in model.named_modules()
                                           if name in report["kept_bfloat16"])


def test_int4_is_a_quarter_of_the_bytes_of_bfloat16_or_less_in_the_decoder():
    body16 = weight_bytes(convert(tiny_pair(hidden_size=256).draft, "bfloat16").base_model.layers)
    body4 = weight_bytes(convert(tiny_pair(hidden_size=256).draft, "int4").base_model.layers)
    assert body4 < 0.35 * body16  # 4 bits a weight, plus a bfloat16 scale and zero per 32


@pytest.mark.parametrize("precision", ["int4", "int8w"])  # the weight-only precisions (int8w: ssd.models.int8_weights)
@pytest.mark.parametrize("method", ["sd", "ssd"])
def test_every_method_at_a_weight_only_precision_reproduces_its_own_ar(method, precision):
    pair = load_pair("tiny", target_dtype=precision, draft_dtype=precision)
    assert precision_of(pair.target) == precision_of(pair.draft) == precision
    ar, _ = generate_ar(pair, PROMPT, DecodeConfig(max_new_tokens=24), torch.Generator().manual_seed(0))
    config = SSDConfig(k=3, budget=6, max_new_tokens=24) if method == "ssd" else DecodeConfig(k=3, max_new_tokens=24)
    run = generate_ssd if method == "ssd" else generate_sd
    tokens, _ = run(pair, PROMPT, config, torch.Generator().manual_seed(0))
    assert tokens == ar


def test_int4_runs_on_cpus_only():
    assert "CPUs only" in unsupported_reason("int4", "cuda")
    assert unsupported_reason("int4", "cpu") is None


def test_a_second_int4_load_reads_the_kept_levels_and_gives_the_same_model(tmp_path, monkeypatch):
    first_pair, second_pair = tiny_pair(), tiny_pair()
    with int4_store.kept(tmp_path) as levels:
        first = convert(first_pair.target, "int4", float_logits=True, int4_levels=levels)
    assert (tmp_path / int4_store.file_name()).is_file() and "lm_head" in levels
    monkeypatch.setattr(int4, "levels_of", lambda *a: pytest.fail("quantized again"))
    with int4_store.kept(tmp_path) as levels:
        second = convert(second_pair.target, "int4", float_logits=True, int4_levels=levels)
    x = torch.tensor([PROMPT])
    with torch.no_grad():
        assert torch.equal(first(x).logits, second(x).logits)
    assert first.int4_report == second.int4_report


def test_a_shipped_model_at_int4_keeps_its_levels_beside_its_float32_cache(tmp_path, monkeypatch):
    private_cache = tmp_path / "cache"
    monkeypatch.setenv("SSD_CACHE_DIR", str(private_cache))
    spec = test_models.shipped_spec(tmp_path, monkeypatch, tiny_pair().draft, "kept")
    first, _ = loading._load_cached(spec, "int4", "cpu", progress=False, role="draft")
    assert (private_cache / "models" / "kept" / int4_store.file_name()).is_file()
    monkeypatch.setattr(int4, "levels_of", lambda *a: pytest.fail("quantized again"))
    second, _ = loading._load_cached(spec, "int4", "cpu", progress=False, role="draft")
    x = torch.tensor([PROMPT])
    with torch.no_grad():
        assert torch.equal(first(x).logits, second(x).logits)


def test_a_disk_that_refuses_the_levels_leaves_the_load_to_quantize_again(tmp_path, capsys):
    with int4_store.kept(tmp_path / "gone") as levels:  # no such folder: the write fails
        convert(tiny_pair().draft, "int4", int4_levels=levels)
    assert "could not keep the int4 layers" in capsys.readouterr().err
    assert not (tmp_path / "gone").exists()


def test_a_kept_file_that_cannot_be_read_counts_as_none(tmp_path):
    from safetensors.torch import save_file

    (tmp_path / int4_store.file_name()).write_bytes(b"half a file")
    assert int4_store.read(tmp_path / int4_store.file_name()) == {}
    save_file({"layer.packed": torch.zeros(2, dtype=torch.uint8)}, tmp_path / "lacking.safetensors")
    assert int4_store.read(tmp_path / "lacking.safetensors") == {}  # no scales, no move: quantized again
