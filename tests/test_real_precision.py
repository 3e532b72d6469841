"""The real pair at a reduced precision: every greedy difference from AR sits at a near-tie of the target's logits.

A bfloat16 target rounds a pass over K + 1 tokens differently from a one-token pass, so where its top two logits
nearly tie, SD may append the other token; that is rounding, and the difference must sit at a margin below
ssd.bench.lossless.near_tie_bound. A wrong residual, an off-by-one in acceptance or a stale cache would differ at
margins of whole logits instead. bfloat16 and int8 are fixed here (not auto), so every machine tests the same thing; on
a CPU without native bfloat16 it is slower, not different.
"""
import pytest
import torch

from ssd.bench.methods import generate_ar  # timed: a measured AR keeps its near-tie margins
from ssd.core.decoding import DecodeConfig
from ssd.bench.lossless import greedy_identical, identity_report
from ssd.models.loading import load_pair
from ssd.models.precision import precision_of
from ssd.bench.prompts import load_prompts
from ssd.core.speculation import SSDConfig

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def pair(cores_of_this_worker):  # conftest keeps tiny models on one thread; a real one gets the worker's cores
    return load_pair("qwen2.5-coder", target_dtype="bfloat16", draft_dtype="int8", progress=False)


def test_the_pair_runs_at_the_precisions_asked(pair):
    assert precision_of(pair.target) == "bfloat16" and precision_of(pair.draft) == "int8"
    assert pair.precisions.reason.startswith("as asked")


def short_prompts():
    """Three of the shortest HumanEval prompts (38 to 48 tokens) and a prose one (44): on a CPU without native
    bfloat16 the prompt's pass is most of these tests' time (36 s for a 118-token prompt at one thread, AVX2)."""
    return [p for i in (23, 27, 24) for p in load_prompts(f"humaneval[{i}:{i + 1}]")] + load_prompts("prose[0:1]")


def test_every_greedy_difference_from_ar_is_at_a_near_tie(pair):
    config = SSDConfig(k=4, max_new_tokens=16, budget=4, fan_out_strategy="calibrated", a_p=0.85, r=1.2)
    frame = greedy_identical(pair, short_prompts(), ["sd", "ssd"], config, progress=False)
    differ = frame[~frame.identical_to_target]
    assert differ.near_tie.eq(True).all(), differ
    assert frame.identical_to_target.mean() >= 0.5, frame  # rounding flips are rare; a bug would flip most


def test_ar_records_the_margin_a_report_reads(pair):
    ids = pair.tokenizer("def add(a, b):").input_ids
    tokens, trace = generate_ar(pair, ids, DecodeConfig(max_new_tokens=6), torch.Generator())
    assert all(r.margin >= 0 and r.top_logit is not None for r in trace.rounds)
    flipped = tokens[:2] + [tokens[2] + 1] + tokens[3:]
    report = identity_report(flipped, tokens, trace.rounds, "bfloat16")
    assert report["first_difference"] == 2 and report["margin_at_difference"] == trace.rounds[2].margin


def test_transformers_peers_run_on_the_same_reduced_precision_models(pair):
    """hf-ar and hf-sd take the pair's own models, bfloat16 target and int8 draft included: every speed-up in one
    bench is over the same model. Their first difference from our AR, if any, sits at a near-tie too."""
    from ssd.bench.run import run_bench
    from ssd.core.decoding import DecodeConfig

    result = run_bench(pair, short_prompts()[:1], ["ar", "hf-ar", "hf-sd"], DecodeConfig(max_new_tokens=8),
                       progress=False)
    for row in result["rows"]:
        assert row["target_dtype"] == "bfloat16" and row["draft_dtype"] == "int8"
        assert row["identical_to_target"] or row["near_tie"], row
