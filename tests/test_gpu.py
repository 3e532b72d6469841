"""The kit on a GPU (CUDA, or Apple's MPS): tiny random pairs moved to the device, checked as on the CPU.

Greedy SD, SSD and transformers' peers give AR's tokens in float32; at the GPU's reduced precision every difference
sits at a near-tie of the target's top two logits (ssd.bench.lossless.near_tie_bound); the tree pre-speculation (its 4D
mask made on the device, in the model's dtype) drafts what each branch drafted alone would; Saguaro keeps the output
distribution the target's; the pipeline runs across two GPUs (NCCL), and on one says it needs a second.

Marked gpu and skipped, with one line saying why, where neither CUDA nor MPS is present (`make gpu-check` runs them on
a GPU). SSD_TEST_DEVICE=cpu runs them on the CPU, which is how they were checked on a machine without a GPU.
"""
import os

import pytest
import torch

import ssd.bench.graphs
import ssd.core.speculation
import ssd.core.tree
from ssd.models.devices import accelerator, resolve_device
from ssd.bench.lossless import ALPHA, distribution_check, greedy_identical
from ssd.models.loading import load_pair
from ssd.models.tiny import tiny_pair
from ssd.pipeline.launch import Pipeline, close_pipelines
from ssd.models.capability import accelerator_precision
from ssd.models.precision import convert, precision_of
from ssd.models.auto_precision import fixed
from ssd.bench.prompts import Prompt
from ssd.core.speculation import SSDConfig, generate_ssd
from ssd.core.decoding import generate_ar

from .test_ssd import assert_tree_drafting_equals_each_branch_alone, tree_and_alone

FORCED = os.environ.get("SSD_TEST_DEVICE")
DEVICE = resolve_device(FORCED) if FORCED else accelerator()
NO_GPU = ("no CUDA or MPS device (torch.cuda.is_available() and torch.backends.mps.is_available() are False); "
          "`make gpu-check` runs these on a GPU")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(DEVICE is None, reason=NO_GPU)]

CUDA_GPUS = torch.cuda.device_count() if DEVICE is not None and DEVICE.type == "cuda" else 0
REDUCED = (accelerator_precision(DEVICE) if DEVICE is not None else None) or "bfloat16"  # the GPU's default
PAIR_ARGS = dict(vocab_size=32, agreement_noise=0.1, seed=4)
PROMPTS = [Prompt(f"p{i}", text, chat=False) for i, text in enumerate(["def add(a, b):", "aaaa bbbb aaaa",
                                                                        "The quick brown fox", "xyzzy 42 :-)"])]
CORES = [str(c) for c in sorted(os.sched_getaffinity(0))] if hasattr(os, "sched_getaffinity") else ["0"]


def pair_on(precision: str = "float32", **tiny):
    """A tiny pair at a precision on the device, as load_pair makes one (a target keeps float32 logits)."""
    pair = tiny_pair(**(PAIR_ARGS | tiny))
    pair.draft = convert(pair.draft.to(DEVICE), precision, "draft_dtype")
    pair.target = convert(pair.target.to(DEVICE), precision, "target_dtype", float_logits=True)
    pair.precisions = fixed(precision, precision, why="tests/test_gpu.py")
    return pair


@pytest.fixture(scope="module")
def pair():
    return pair_on("float32")


def test_load_pair_puts_both_models_on_the_device():
    pair = load_pair("tiny", device=DEVICE, progress=False)
    assert pair.draft.device.type == pair.target.device.type == DEVICE.type
    assert pair.precisions.target == "float32"  # a tiny pair stays the exact reference, on any device
    if not FORCED:
        assert load_pair("tiny", device="auto", progress=False).target.device.type == DEVICE.type


def test_greedy_sd_ssd_and_the_peers_are_identical_to_ar_in_float32(pair):
    config = SSDConfig(k=4, temperature=0.0, max_new_tokens=40, budget=8)
    table = greedy_identical(pair, PROMPTS, ["sd", "ssd", "hf-ar", "hf-sd"], config, progress=False)
    assert table.identical_to_target.all(), table


@pytest.mark.parametrize("options", [dict(budget=0), dict(budget=16, fan_out_strategy="geometric", backup="fast"),
                                     dict(budget=4, fan_out_strategy="calibrated", saguaro_c=0.3)],
                         ids=["b0", "geometric-fast", "calibrated-saguaro"])
def test_greedy_ssd_is_identical_to_ar_at_any_budget_and_backup(pair, options):
    config = SSDConfig(k=4, temperature=0.0, max_new_tokens=30, **options)
    for prompt in ([1, 2, 3], [7, 7, 1, 7, 7, 1, 7]):
        reference, _ = generate_ar(pair, prompt, config, torch.Generator())
        assert generate_ssd(pair, prompt, config, torch.Generator().manual_seed(0))[0] == reference


def test_tree_drafting_equals_drafting_each_branch_alone_in_float32(pair):
    assert_tree_drafting_equals_each_branch_alone(pair.draft)


def test_the_tree_mask_is_made_on_the_device_in_the_models_dtype(monkeypatch):
    draft = pair_on(REDUCED).draft
    made = []

    def spy(prefix_visible, depth, dtype, *rest):
        mask = real(prefix_visible, depth, dtype, *rest)
        made.append((mask.dtype, mask.device.type))
        return mask

    real = ssd.core.tree.tree_mask
    monkeypatch.setattr(ssd.core.tree, "tree_mask", spy)
    for branch, alone in tree_and_alone(draft):
        # Each branch's first row against the same position drafted alone, both at the reduced precision: they
        # differ by rounding only (float32 above checks every row and token exactly).
        torch.testing.assert_close(branch.logits[0], alone.logits[0], atol=0.1, rtol=0.05)
    assert made and set(made) == {(getattr(torch, REDUCED), DEVICE.type)}


def test_reduced_precision_greedy_differences_sit_at_near_ties():
    pair = pair_on(REDUCED, vocab_size=256)  # with this vocabulary some outputs differ in bfloat16 on a CPU
    assert precision_of(pair.target) == REDUCED
    config = SSDConfig(k=4, temperature=0.0, max_new_tokens=40, budget=8)
    table = greedy_identical(pair, PROMPTS, ["sd", "ssd", "hf-sd"], config, progress=False)
    differ = table[~table.identical_to_target]
    assert differ.near_tie.eq(True).all(), differ  # a difference at a larger margin is a bug, not rounding


def test_saguaro_keeps_the_target_distribution():
    pair = pair_on("float32", vocab_size=6, agreement_noise=0.2, seed=2)
    config = SSDConfig(k=2, temperature=0.9, max_new_tokens=2, budget=6, saguaro_c=0.2)
    check = distribution_check(pair, [1, 4, 2, 1, 4], "ssd", config, samples=800, progress=False)
    assert check["p_value"] > ALPHA, check["table"].head(10)


@pytest.mark.skipif(CUDA_GPUS < 2, reason="the pipeline across GPUs needs two CUDA devices")
def test_the_pipeline_round_trip_across_two_gpus(pair):
    close_pipelines()
    config = SSDConfig(k=4, temperature=0.0, max_new_tokens=30, budget=8)
    with Pipeline(pair, verifier_cores=CORES[0], drafter_cores=CORES[-1], timeout_s=60) as pipeline:
        assert pipeline.drafter["device"] == "cuda:1"  # the next GPU after the verifier's cuda:0
        for prompt in ([1, 2, 3], [7, 7, 1, 7, 7, 1, 7]):
            tokens, _ = pipeline.generate(prompt, config, torch.Generator().manual_seed(0))
            assert tokens == generate_ar(pair, prompt, config, torch.Generator())[0]


@pytest.mark.skipif(CUDA_GPUS != 1, reason="the one-GPU message needs exactly one CUDA device")
def test_on_one_gpu_the_pipeline_says_it_needs_a_second(pair):
    close_pipelines()
    with pytest.raises(ValueError, match="the pipeline needs a second GPU"):
        Pipeline(pair, verifier_cores=CORES[0], drafter_cores=CORES[-1])


@pytest.mark.skipif(DEVICE is None or DEVICE.type != "cuda", reason="CUDA graphs need a CUDA device")
def test_a_pass_replayed_from_a_cuda_graph_gives_the_eager_pass_logits(pair):
    """ssd.bench.graphs: what make gpu-check times replayed is the pass it times eager, output for output."""
    run = ssd.bench.graphs.static_pass(pair.target, 2, 5, context=16)
    with torch.inference_mode():
        eager = run().clone()
        replay, out = ssd.bench.graphs.graphed(run)
        replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, eager, rtol=1e-6, atol=1e-6)
