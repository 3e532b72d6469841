"""The int8w precision (ssd.models.int8_weights): each weight moves by at most half its row's step, the kernel
multiplies by the weights it says, and a target rescores its best logits in float32. That every method at int8w
reproduces int8w's own AR is tested beside int4's (tests/test_int4.py)."""
import torch

from ssd.models.capability import unsupported_reason
from ssd.models.int8_weights import LEVELS, Int8WeightLinear, dequantize, quantizable, quantize
from ssd.models.precision import convert, precision_of, weight_bytes
from ssd.models.rescored_logits import RescoredLogits
from ssd.models.tiny import tiny_pair


def test_a_weight_moves_by_at_most_half_its_rows_step():
    weight = torch.randn(48, 96, generator=torch.Generator().manual_seed(0))
    q, scales = quantize(weight)
    assert q.dtype == torch.int8 and scales.dtype == torch.bfloat16 and q.abs().max() <= LEVELS
    step = scales.float()[:, None]
    assert ((dequantize(q, scales) - weight).abs() <= step / 2 + 1e-7).all()
    # the step is a row's largest weight over LEVELS, rounded to bfloat16 (8 bits)
    torch.testing.assert_close(scales.float(), weight.abs().amax(1) / LEVELS, rtol=2 ** -8, atol=0)


def test_the_kernel_multiplies_by_the_weights_it_says():
    linear = torch.nn.Linear(128, 96)
    layer, moved = Int8WeightLinear.from_linear(linear)
    assert 0 < moved <= 0.5 / LEVELS * 1.01
    x = torch.randn(3, 5, 128).bfloat16()
    expected = x.float() @ dequantize(*quantize(linear.weight.detach())).t() + linear.bias.bfloat16().float()
    got = layer(x)
    assert got.shape == (3, 5, 96) and got.dtype == torch.bfloat16
    assert ((got.float() - expected).norm() / expected.norm()) < 1e-2


def test_a_layer_whose_width_the_kernel_cannot_take_stays_bfloat16():
    assert quantizable(torch.nn.Linear(48, 10)) and not quantizable(torch.nn.Linear(40, 10))
    model = tiny_pair(hidden_size=40).draft  # torch 2.13's kernel crashed the process at an input width of 40
    report = convert(model, "int8w").int8w_report
    assert report["kept_bfloat16"] and all(isinstance(m, torch.nn.Linear) for name, m in model.named_modules()
                                           if name in report["kept_bfloat16"])


def test_a_target_rescores_its_best_logits_in_float32_and_a_draft_quantizes_its_own_output_layer():
    pair = tiny_pair()
    target = convert(pair.target, "int8w", float_logits=True)
    draft = convert(pair.draft, "int8w")
    head = target.get_output_embeddings()
    assert isinstance(head, RescoredLogits) and isinstance(head.approximate, Int8WeightLinear)
    assert isinstance(draft.get_output_embeddings(), Int8WeightLinear)
    assert precision_of(target) == precision_of(draft) == "int8w"
    assert draft.get_input_embeddings().weight.dtype == torch.bfloat16  # the lookup stays: a tied head is copied
    assert draft.int8w_report["int8w_layers"] == 2 * 7 + 1 and draft.int8w_report["kept_bfloat16"] == []


def test_int8w_is_about_half_the_bytes_of_bfloat16_in_the_decoder():
    body16 = weight_bytes(convert(tiny_pair(hidden_size=256).draft, "bfloat16").base_model.layers)
    body8 = weight_bytes(convert(tiny_pair(hidden_size=256).draft, "int8w").base_model.layers)
    assert body8 < 0.55 * body16  # a byte a weight, plus a bfloat16 scale a row and the norms


def test_int8w_runs_on_cpus_only():
    assert "CPUs only" in unsupported_reason("int8w", "cuda")
    assert unsupported_reason("int8w", "cpu") is None
