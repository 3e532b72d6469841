"""The kit's int4 kernel (ssd.models.int4_kernel, on CPUs with avx512_bf16): the weights it says, every row as its
one-row call computes it, and the layers that use it. Elsewhere torch's kernel runs int4 and these are skipped."""
import pytest
import torch

from ssd.models import int4, int4_kernel, int4_store
from ssd.models.precision import convert
from ssd.models.tiny import tiny_pair

pytestmark = pytest.mark.skipif(not int4_kernel.load(), reason="the kit's int4 kernel runs on CPUs with avx512_bf16")


def layer(out: int, width: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (out, width), dtype=torch.int32, generator=generator)
    scale = (torch.rand(width // 32, out, generator=generator) * 0.02 + 0.002).bfloat16()
    zero = (torch.randn(width // 32, out, generator=generator) * 0.02).bfloat16()
    return q, torch.stack([scale, zero], -1).contiguous()


@pytest.mark.parametrize("out, width", [(64, 128), (48, 96), (160, 320)])
def test_the_kernel_multiplies_by_the_weights_it_says(out, width):
    q, scales_and_zeros = layer(out, width)
    packed = torch.ops.ssd_int4.pack(q, scales_and_zeros)
    x = torch.randn(7, width).bfloat16()
    exact = x.double() @ int4.dequantize(q, scales_and_zeros).double().T
    y = torch.ops.ssd_int4.mm(x, packed, out)
    torchs = torch.ops.aten._weight_int4pack_mm_for_cpu(x, torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1),
                                                        int4.GROUP, scales_and_zeros)
    largest = exact.abs().max()
    assert ((y.double() - exact).abs().max() / largest) < 4e-3  # the bfloat16 output's rounding, no more
    assert ((y.double() - torchs.double()).abs().max() / largest) < 4e-3  # and torch's within one step of it


def test_every_row_is_its_one_row_call_bit_for_bit():
    """So a verify pass over K + 1 tokens computes what K + 1 steps would: rows in chunks of 5, each its own sums."""
    q, scales_and_zeros = layer(160, 320, seed=1)
    packed = torch.ops.ssd_int4.pack(q, scales_and_zeros)
    x = torch.randn(12, 320).bfloat16()
    for rows in (2, 3, 4, 5, 12):
        together = torch.ops.ssd_int4.mm(x[:rows], packed, 160)
        assert all(torch.equal(torch.ops.ssd_int4.mm(x[r:r + 1], packed, 160)[0], together[r]) for r in range(rows))


def test_int4_layers_use_it_and_keep_one_copy_of_the_scales():
    model = convert(tiny_pair().target, "int4", "target_dtype")
    layers = [m for m in model.modules() if isinstance(m, int4.Int4Linear)]
    assert layers and all(m.packed.dim() == 1 and m.scales_and_zeros is None for m in layers)
    assert int4.kernel() == "ssd" and "-ssd-" in int4_store.file_name()


def test_bad_shapes_fail_with_the_operator_named():
    q, scales_and_zeros = layer(64, 128)
    with pytest.raises(RuntimeError, match="ssd_int4::pack: out must be a multiple of 16"):
        torch.ops.ssd_int4.pack(q[:40], scales_and_zeros[:, :40])
    with pytest.raises(RuntimeError, match="ssd_int4::mm: x must be bfloat16"):
        torch.ops.ssd_int4.mm(torch.randn(1, 128), torch.ops.ssd_int4.pack(q, scales_and_zeros), 64)


def test_a_profile_on_the_kits_kernel_is_kept_apart_from_torchs(monkeypatch):
    """A latency profile measured on torch's int4 kernel must not price a pair on the kit's (ssd.bench.profile)."""
    from ssd.bench import profile
    from ssd.models.loading import load_pair

    pair = load_pair("tiny", target_dtype="int4", draft_dtype="int4", progress=False)
    assert int4.kernel_of(pair.target) == int4.kernel_of(pair.draft) == "ssd"
    ours = profile.profile_path(pair, "0", "1")
    monkeypatch.setattr(profile, "kernel_of", lambda model: "torch")
    assert profile.profile_path(pair, "0", "1") != ours


@pytest.mark.integration  # inductor compiles C++ with the system's compiler: a process
def test_compiled_forwards_call_the_kernel_and_sd_keeps_ar_s_tokens():
    """torch.compile traces through ssd_int4::mm by its shape function; on the compiled int4 tiny pair SD gives its AR's
    tokens (each row of a verify pass is its one-row step's, bit for bit, in the kernel), and its logits are the eager
    pair's up to bfloat16 rounding (inductor fuses the bfloat16 work around the kernel otherwise)."""
    from ssd.core.cached_model import CachedModel
    from ssd.core.decoding import DecodeConfig, generate_ar, generate_sd
    from ssd.models.loading import load_pair

    compiled = load_pair("tiny", target_dtype="int4", draft_dtype="int4", forward="compiled", progress=False)
    assert int4.kernel_of(compiled.target) == "ssd"
    for prompt in ([1, 5, 2, 9, 3], [4, 4, 8, 1]):
        config = DecodeConfig(k=3, max_new_tokens=16)
        want, _ = generate_ar(compiled, prompt, config, torch.Generator())
        got, _ = generate_sd(compiled, prompt, config, torch.Generator())
        assert got == want
    eager = load_pair("tiny", target_dtype="int4", draft_dtype="int4", progress=False)
    ids = [i % 16 for i in range(5, 50)]
    a, b = CachedModel(compiled.target), CachedModel(eager.target, fixed_shapes=True)
    for cached in (a, b):
        cached.prefill(ids[:40])
    torch.testing.assert_close(a.logits(ids[:44], keep=4), b.logits(ids[:44], keep=4), rtol=0.02, atol=0.05)
