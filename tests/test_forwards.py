"""Compiled forwards (ssd.models.forwards): one flag away from eager, refused by name when misspelt, and lossless: every
method on a compiled tiny pair draws golden.json's tokens and rounds, which the eager forwards drew."""
import json
import os

import pytest
import torch

from ssd.bench.prompts import load_prompts
from ssd.bench.run import run_bench
from ssd.core.cached_model import CachedModel
from ssd.core.decoding import DecodeConfig
from ssd.models import forwards
from ssd.models.forwards import MAX_WIDTH, forward_of
from ssd.models.loading import load_pair
from ssd.models.tiny import tiny_pair
from ssd.pipeline.launch import close_pipelines
from tests import test_golden as golden  # its cases and its record of a run


def test_a_misspelt_forward_is_refused_by_name_before_anything_loads():
    with pytest.raises(ValueError, match="forward must be one of eager, compiled; got 'jit'"):
        load_pair("no-such-pair", forward="jit")  # the forward is checked before the pair's name


def test_a_pair_is_eager_unless_asked_and_says_so():
    pair = load_pair("tiny")
    assert pair.forward == "eager" and forward_of(pair.target) == forward_of(pair.draft) == "eager"
    assert CachedModel(pair.target).fixed_shapes is False


def test_a_model_that_needs_fixed_shapes_gets_them_by_default():
    model = tiny_pair().target
    model.fixed_shapes = True  # what compile_forward sets
    assert CachedModel(model).fixed_shapes is True
    assert CachedModel(model, fixed_shapes=False).fixed_shapes is False  # asked: as asked


@pytest.fixture(scope="module")
def compiled_pair():
    return load_pair("tiny", forward="compiled", progress=False)


@pytest.mark.integration  # inductor compiles C++ with the system's compiler: a process
@pytest.mark.parametrize("case", ["ar", "sd", "ssd-uniform", "ssd-calibrated", "ssd-pipeline"])
def test_compiled_forwards_draw_the_golden_tokens_and_rounds(compiled_pair, case):
    """The pipeline's drafter, in its own process, compiles its draft as the verifier's pair is compiled."""
    pinned = json.loads(golden.GOLDEN.read_text())
    _, method, fields = next(c for c in golden.CASES if c[0] == case)
    try:
        for t in golden.TEMPERATURES:
            for s in golden.SEEDS:
                now, key = golden.record(compiled_pair, method, fields, t, s), golden.key(case, t, s)
                assert now["tokens"] == pinned[key]["tokens"], f"{key}: tokens moved"
                assert now["rounds"] == pinned[key]["rounds"], f"{key}: rounds moved"
        if case == "ssd-pipeline":
            assert compiled_pair.pipeline.drafter.forward == "compiled"
    finally:
        close_pipelines()


@pytest.mark.integration
def test_the_compiled_pair_compiled_the_decoding_shapes_only(compiled_pair):
    """After the golden cases: the steps, verify passes and tree depths ran compiled, never a prompt-wide block. (Which
    graphs this model made itself depends on what ran before it in the process: another compiled tiny pair's graphs
    serve it, and CI failed once on asserting those.)"""
    golden.record(compiled_pair, "sd", {"k": 3}, 0.0, 0)
    assert compiled_pair.forward == "compiled"
    for model in (compiled_pair.target, compiled_pair.draft):
        shapes = model.compiled_shapes
        assert shapes and all(width <= MAX_WIDTH for _, width, _ in shapes)
        assert all(seconds > 0 for seconds in shapes.values())


@pytest.mark.integration
def test_a_compiled_pass_gives_the_eager_logits(compiled_pair):
    eager = tiny_pair()
    ids = [i % 16 for i in range(5, 60)]
    got, want = CachedModel(compiled_pair.target), CachedModel(eager.target, fixed_shapes=True)
    for cached in (got, want):
        cached.prefill(ids[:40])
    for n in (41, 45, 50):
        a, b = got.logits(ids[:n], keep=n - got.length()), want.logits(ids[:n], keep=n - want.length())
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.integration
def test_a_graph_serves_the_next_cache_bucket_when_the_head_size_equals_a_bucket():
    """A head size of 64 is also the first bucket's slots: traced as one symbol, the graph held the bucket at 64 and
    a decode that outgrew it traced the whole model again (13 s on the offline target at 128). The cache marks its
    heads and head size static, so the only new graph past the bucket is none."""
    model = forwards.compile_forward(tiny_pair(hidden_size=256, max_context=512).target, progress=False)
    assert model.config.hidden_size // model.config.num_attention_heads == 64
    cached, ids = CachedModel(model), [i % 16 for i in range(200)]
    cached.prefill(ids[:40])  # 39 tokens, eager
    for n in (40, 44, 48):  # a step and two verify passes of 4, within the first bucket of 64 slots: two graphs
        cached.logits(ids[:n], keep=1)
    made = forwards.graphs_made()
    for n in (49, 53, 57, 61, 65, 66, 70):  # the same widths across the bucket's edge, into 128 slots
        cached.logits(ids[:n], keep=1)
    assert cached.cache.layers[0].capacity == 128
    assert forwards.graphs_made() == made


def test_inductors_cache_goes_under_the_user_cache_unless_the_user_chose_a_folder(monkeypatch, tmp_path):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("SSD_CACHE_DIR", str(tmp_path / "ssd"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.path.abspath(default_cache_dir()))  # what importing torch sets
    forwards._keep_inductor_cache_in_user_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "ssd" / forwards.INDUCTOR_CACHE)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    forwards._keep_inductor_cache_in_user_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")


@pytest.mark.integration
def test_a_compiled_bench_makes_its_graphs_in_the_warm_up_and_says_so_per_answer():
    pair = load_pair("tiny", forward="compiled", progress=False)
    result = run_bench(pair, load_prompts("prose[0:3]"), ["ar", "sd"], DecodeConfig(k=3, max_new_tokens=12),
                       progress=False)
    assert [row["graphs_made"] for row in result["rows"]] == [0] * 6  # the warm-up decoded a whole answer each
    assert all(row["forward"] == "compiled" for row in result["rows"])
