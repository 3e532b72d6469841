"""The real qwen2.5-coder pair in float32, where realism matters: lossless greedy SD and the peers, on HumanEval
prompts. (test_real_precision.py: the same pair at reduced precision.)"""
import pytest
import torch

from ssd.bench.run import run_bench
from ssd.core.decoding import DecodeConfig, generate_ar, generate_sd
from ssd.models.loading import load_pair
from ssd.bench.prompts import encode, load_prompts
from ssd.core.speculation import SSDConfig, generate_ssd

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def pair(cores_of_this_worker):  # conftest keeps tiny models on one thread; a real one gets the worker's cores
    return load_pair("qwen2.5-coder", target_dtype="float32", draft_dtype="float32", progress=False)  # exact reference


@pytest.fixture(scope="module")
def prompts(pair):
    return [encode(pair.tokenizer, p) for p in load_prompts("humaneval[10:12]")]


@pytest.fixture(scope="module")
def references(pair, prompts):
    """AR's 12 greedy tokens on each prompt: the target alone, which every method below must equal."""
    config = DecodeConfig(max_new_tokens=12)
    return [generate_ar(pair, ids, config, torch.Generator().manual_seed(0))[0] for ids in prompts]


def test_greedy_sd_is_token_identical_to_the_target_for_every_k(pair, prompts, references):
    for ids, reference in zip(prompts, references):
        assert len(reference) == 12
        for k in (1, 3, 8):
            tokens, trace = generate_sd(pair, ids, DecodeConfig(k=k, max_new_tokens=12), torch.Generator().manual_seed(0))
            assert tokens == reference, f"k={k}"
            assert trace.acceptance_rate is not None and trace.acceptance_rate > 0.3  # a real draft, a real agreement


def test_sampling_is_reproducible_for_a_seed(pair, prompts):
    config = DecodeConfig(k=4, temperature=0.7, max_new_tokens=8)
    a = generate_sd(pair, prompts[0], config, torch.Generator().manual_seed(3))[0]
    b = generate_sd(pair, prompts[0], config, torch.Generator().manual_seed(3))[0]
    assert a == b


def test_bench_runs_all_methods_and_all_are_identical_to_the_target(pair):
    methods = ["ar", "hf-ar", "sd", "hf-sd", "ssd"]  # on a short prompt (41 tokens): each method passes it twice
    result = run_bench(pair, load_prompts("humaneval[45:46]"), methods, SSDConfig(k=4, max_new_tokens=8, budget=8),
                       progress=False)
    assert [r["identical_to_target"] for r in result["rows"]] == [True] * len(methods)
    summary = {s["method"]: s for s in result["summary"]}
    assert summary["ar"]["speedup_vs_ar"] == 1.0
    assert summary["sd"]["acceptance_rate"] is not None and summary["hf-sd"]["acceptance_rate"] is None
    assert summary["sd"]["speedup_vs_peer"] > 0 and summary["ar"]["speedup_vs_peer"] > 0
    assert 0 < summary["ssd"]["hit_rate"] <= 1 and summary["ssd"]["predicted_speedup_vs_ar"] > 0


@pytest.mark.parametrize(
    "options",
    [
        dict(budget=4, fan_out_strategy="uniform", saguaro_c=1.0, backup="jit"),
        dict(budget=16, fan_out_strategy="geometric", saguaro_c=0.7, backup="fast"),
        dict(budget=64, fan_out_strategy="calibrated", saguaro_c=0.0, backup="jit"),
    ],
    ids=["uniform-4", "geometric-16-fast", "calibrated-64-c0"],
)
def test_greedy_ssd_is_token_identical_to_the_target(pair, prompts, references, options):
    config = SSDConfig(k=4, max_new_tokens=12, **options)
    tokens, trace = generate_ssd(pair, prompts[1], config, torch.Generator().manual_seed(0))
    assert tokens == references[1]
    assert trace.hit_rate > 0  # code on a real pair: the cache does get hit


def test_greedy_pipeline_is_token_identical_to_the_target(pair, prompts, references):
    from ssd.pipeline.launch import PipelineConfig, close_pipelines, generate_ssd_pipeline

    ids, reference = prompts[0], references[0]
    config = PipelineConfig(k=4, max_new_tokens=12, budget=4, fan_out_strategy="calibrated", a_p=0.85, r=1.2)
    try:
        tokens, trace = generate_ssd_pipeline(pair, ids, config, torch.Generator().manual_seed(0))
    finally:
        close_pipelines()
    assert tokens == reference
    assert trace.method == "ssd-pipeline" and trace.hit_rate > 0


def test_greedy_batches_are_token_identical_to_the_target_alone(pair):
    """Eight HumanEval prompts (ragged, 38 to 67 tokens: short ones, since the prompts' pass is most of the time)
    decoded at b = 8 by ar, sd and ssd, one forward per step over all of them: every row equals AR on its prompt
    alone."""
    short = load_prompts("humaneval[13:17]") + load_prompts("humaneval[23:25]") + load_prompts("humaneval[27:29]")
    prompts = [encode(pair.tokenizer, p) for p in short]
    config = SSDConfig(k=4, budget=8, max_new_tokens=8)
    reference = [generate_ar(pair, ids, config, torch.Generator().manual_seed(0))[0] for ids in prompts]
    for method in (generate_ar, generate_sd, generate_ssd):
        tokens, traces = method(pair, prompts, config, torch.Generator().manual_seed(0))
        assert tokens == reference, method.__name__
        assert {t.batch_size for t in traces} == {8}
    assert 0 < sum(r.hit for t in traces for r in t.rounds) < sum(len(t.rounds) for t in traces)
