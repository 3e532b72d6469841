"""Precision per model: names, conversion, the auto rule on synthetic timings, and the decision kept in the cache."""
import json

import pytest
import torch

from ssd.models import loading as models, precision
from ssd.core.decoding import DecodeConfig, generate_ar, generate_sd
from ssd.bench.lossless import first_difference, identity_report, near_tie_bound
from ssd.models.loading import load_pair
from ssd.models.tiny import tiny_pair
from ssd.models.shapes import random_pair
from ssd.models.auto_precision import Precisions, agreement, candidates, choose, greedy_tokens
from ssd.models.capability import supported
from ssd.models.precision import check_precision, convert, precision_of, weight_bytes
from ssd.core.trace import Round

AVX2 = {"cpu": "test cpu", "isa": "AVX2", "flags": ["avx2"], "native": [], "int8_engine": "x86", "cores": 2,
        "torch": torch.__version__}
BF16 = AVX2 | {"isa": "AVX512", "flags": ["avx2", "avx512f", "avx512_bf16"], "native": ["bfloat16"]}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SSD_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


# ---- names ---------------------------------------------------------------------------------------------------------


def test_names_and_dtypes_are_accepted():
    assert check_precision("int8") == "int8" and check_precision(torch.bfloat16) == "bfloat16"
    assert check_precision("auto") == "auto"


@pytest.mark.parametrize("bad", ["fp32", "bf16", "", None, torch.int8])
def test_bad_precision_names_the_parameter_and_the_choices(bad):
    choices = "float32, bfloat16, float16, int8, int4, int8w, auto"
    with pytest.raises(ValueError, match=f"draft_dtype must be one of {choices}"):
        check_precision(bad, "draft_dtype")


def test_auto_is_refused_where_a_concrete_precision_is_needed():
    choices = "float32, bfloat16, float16, int8, int4, int8w"
    with pytest.raises(ValueError, match=f"dtype must be one of {choices}; got 'auto'"):
        convert(tiny_pair().draft, "auto")


def test_int8_is_cpu_only(monkeypatch):
    assert supported("int8", "cpu") and not supported("int8", "cuda") and not supported("int8", "mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the message, not a GPU, is what is tested
    with pytest.raises(ValueError, match="draft_dtype=int8 is not supported on cuda: int8 runs on CPUs only"):
        load_pair("tiny", draft_dtype="int8", device="cuda")


def test_int8_rounds_a_row_on_a_scale_the_other_rows_set():
    """Why int8 is a draft's precision only: torch.ao's dynamic quantization takes one activation scale per call, so
    a token's row comes out otherwise in a verify pass (beside a larger row) than in a one-token step."""
    torch.manual_seed(0)
    layer = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(torch.nn.Linear(64, 32)), {torch.nn.Linear},
                                                   dtype=torch.qint8)
    small, large = torch.randn(1, 64), 100 * torch.randn(1, 64)
    alone, beside = layer(small), layer(torch.cat([small, large]))[:1]
    assert not torch.equal(alone, beside)
    assert (alone - beside).abs().max() > 0.01 * alone.abs().max()  # a grid 100 times coarser, not last-bit noise


def test_a_target_at_int8_fails_before_any_model_loads(monkeypatch):
    allowed = "float32, bfloat16, float16, int4, int8w, auto"
    message = (r"^target_dtype=int8 is a draft's precision only: it rounds a verify pass's tokens on one scale they "
               rf"share, so no method could reproduce the target's own AR; use {allowed}$")
    with monkeypatch.context() as patched:
        patched.setattr(models, "tiny_pair", lambda *a, **k: pytest.fail("a model was built"))
        with pytest.raises(ValueError, match=message):
            load_pair("tiny", target_dtype="int8")
        with pytest.raises(ValueError, match=message):
            random_pair(target_dtype="int8")
    assert precision_of(load_pair("tiny", target_dtype="float32", draft_dtype="int8").draft) == "int8"  # a draft may


# ---- conversion ----------------------------------------------------------------------------------------------------


def test_convert_changes_precision_and_memory():
    pair = tiny_pair(vocab_size=64, hidden_size=64)
    x = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = pair.target(x).logits
    full = weight_bytes(pair.target)
    target = convert(pair.target, "int8")
    assert precision_of(target) == "int8"
    assert weight_bytes(target) < 0.5 * full  # the linear layers' weights went from 4 bytes to 1
    with torch.no_grad():  # the same model, roughly: int8 rounds every weight and activation
        cosine = torch.nn.functional.cosine_similarity(target(x).logits.flatten(), reference.flatten(), dim=0)
    assert cosine > 0.9
    draft = convert(pair.draft, "bfloat16")
    assert precision_of(draft) == "bfloat16" and weight_bytes(draft) * 2 == weight_bytes(tiny_pair(vocab_size=64, hidden_size=64).draft)


def test_a_reduced_precision_target_keeps_float32_logits():
    pair = tiny_pair(vocab_size=64, hidden_size=64)
    x = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        exact = pair.target(x).logits
    target = convert(pair.target, "bfloat16", float_logits=True)
    assert precision_of(target) == "bfloat16" and isinstance(target.get_output_embeddings(), precision.FloatLogits)
    assert target.get_output_embeddings().weight.dtype == torch.float32
    with torch.no_grad():
        logits = target(x).logits
    assert logits.dtype == torch.float32 and (logits - exact).abs().max() < 0.1
    # rounded to bfloat16, many logits would share a value; kept in float32 they do not
    assert logits.to(torch.bfloat16).unique().numel() < logits.numel() == logits.unique().numel()
    draft = convert(tiny_pair().draft, "bfloat16")  # a draft's logits may round: only speed and acceptance move
    assert draft.get_output_embeddings().weight.dtype == torch.bfloat16


def test_load_pair_gives_a_reduced_precision_target_float32_logits():
    pair = load_pair("tiny", target_dtype="bfloat16", draft_dtype="bfloat16")
    assert isinstance(pair.target.get_output_embeddings(), precision.FloatLogits)
    assert not isinstance(pair.draft.get_output_embeddings(), precision.FloatLogits)


def test_draft_precision_changes_speed_and_acceptance_never_the_output():
    pair = load_pair("tiny", target_dtype="float32", draft_dtype="int8")
    assert pair.precisions.target == "float32" and precision_of(pair.draft) == "int8"
    prompt = [1, 5, 2, 9, 3]
    config = DecodeConfig(k=4, max_new_tokens=24)
    reference, _ = generate_ar(pair, prompt, config, torch.Generator())
    tokens, trace = generate_sd(pair, prompt, config, torch.Generator())
    assert tokens == reference and trace.acceptance_rate > 0


# ---- the auto rule -------------------------------------------------------------------------------------------------


def test_candidates_follow_what_the_cpu_supports():
    assert candidates("target", "cpu", AVX2) == ["float32", "int4", "int8w"]  # no native bfloat16: not timed
    assert candidates("draft", "cpu", AVX2) == ["float32", "int4", "int8w", "int8"]
    assert candidates("target", "cpu", BF16) == ["float32", "bfloat16", "int4", "int8w"]
    assert candidates("draft", "cpu", BF16) == ["float32", "bfloat16", "int4", "int8w", "int8"]


def flat(ms: float, fifth: float | None = None) -> dict:
    """A target's pass times over 2 to 5 tokens: each `ms`, the 5-token pass `fifth` where given."""
    return {2: ms, 3: ms, 4: ms, 5: fifth or ms}


def agreeing(a: float, targets=("float32", "bfloat16", "int4"), drafts=("float32", "int8", "int4")) -> dict:
    return {t: dict.fromkeys(drafts, a) for t in targets}


def test_a_reduced_precision_target_must_be_clearly_faster():
    draft, a = {"float32": 170.0, "int8": 55.0}, agreeing(0.8)
    assert choose({"float32": flat(1000), "bfloat16": flat(350)}, draft, a, BF16).target == "bfloat16"
    assert choose({"float32": flat(1000), "bfloat16": flat(950)}, draft, a, BF16).target == "float32"  # 5% is not
    # enough
    assert choose({"float32": flat(900), "bfloat16": flat(1400)}, draft, a, BF16).target == "float32"  # AVX2-like


def test_the_pair_is_priced_at_the_draft_length_that_suits_its_kernel():
    # int4's kernel takes rows four at a time: 5 tokens cost two passes, so it is judged at K 3, not 4, and wins there
    decision = choose({"float32": flat(400), "int4": flat(180, fifth=360)}, {"int4": 20.0}, agreeing(0.8), BF16)
    assert decision.target == "int4" and "at K 3" in decision.reason


def test_acceptance_weighs_against_a_faster_draft_step():
    target = {"float32": flat(300)}
    rates = {"float32": {"float32": 0.8, "int8": 0.3}}
    # int8 drafts 2x faster but agrees far less: the slower draft makes SD faster
    assert choose(target, {"float32": 60.0, "int8": 30.0}, rates, BF16).draft == "float32"
    # agreeing alike, the faster step wins
    assert choose(target, {"float32": 60.0, "int8": 30.0}, agreeing(0.8, ("float32",)), BF16).draft == "int8"


def test_the_reason_names_the_pair_its_prediction_and_the_measurements():
    decision = choose({"float32": flat(900)}, {"float32": 150.0, "int8": 54.0},
                      agreeing(0.8, ("float32",), ("float32", "int8")), AVX2)
    assert (decision.target, decision.draft) == ("float32", "int8")
    assert "SD predicted" in decision.reason and "int8 54 ms" in decision.reason and "AVX2" in decision.reason
    assert decision.measured_ms["target"] == {"float32": {"2": 900, "3": 900, "4": 900, "5": 900}}
    assert decision.measured_ms["agreement"] == {"float32": {"float32": 0.8, "int8": 0.8}}


def test_auto_on_a_tiny_pair_is_the_exact_reference():
    pair = load_pair("tiny")
    assert (pair.precisions.target, pair.precisions.draft) == ("float32", "float32")
    assert "tiny" in pair.precisions.reason


def test_auto_measures_once_and_keeps_the_decision(tmp_path, monkeypatch, private_cache):
    from tests.test_models import shipped_spec

    tiny = tiny_pair(agreement_noise=0.5)
    spec = models.PairSpec(shipped_spec(tmp_path, monkeypatch, tiny.draft, "d"),
                           shipped_spec(tmp_path, monkeypatch, tiny.target, "t"))
    monkeypatch.setitem(models.PAIRS, "fake-pair", spec)
    monkeypatch.setattr(models, "capability", lambda: BF16)
    timed = []

    def fake_pass_ms(model, role):  # bfloat16 verifies 3x faster than float32; int8 drafts 3x faster
        p = precision_of(model)
        timed.append((role, p))
        ms = {"float32": 900.0, "bfloat16": 300.0, "int8": 100.0, "int4": 1200.0, "int8w": 1100.0}[p]
        return {n: ms for n in (2, 3, 4, 5)} if role == "target" else ms / 5

    monkeypatch.setattr(models, "pass_ms", fake_pass_ms)
    monkeypatch.setattr(models, "agreement", lambda target, draft: 0.8)  # its own test below
    pair = load_pair("fake-pair", progress=False)
    assert (pair.precisions.target, pair.precisions.draft) == ("bfloat16", "int8")
    assert precision_of(pair.target) == "bfloat16" and precision_of(pair.draft) == "int8"
    assert sorted(timed) == sorted([("draft", p) for p in ("float32", "bfloat16", "int4", "int8w", "int8")]
                                   + [("target", p) for p in ("float32", "bfloat16", "int4", "int8w")])
    saved = list((private_cache / "precision").glob("*.json"))
    assert len(saved) == 1 and json.loads(saved[0].read_text())["draft"] == "int8"
    # A second load reads the decision; a role asked for explicitly overrides it and says so.
    monkeypatch.setattr(models, "pass_ms", lambda *a, **k: pytest.fail("measured twice"))
    again = load_pair("fake-pair", target_dtype="float32", progress=False)
    assert (again.precisions.target, again.precisions.draft) == ("float32", "int8")
    assert "target float32 (as asked)" in again.precisions.reason and "draft int8 (auto)" in again.precisions.reason


def test_acceptance_is_the_share_of_positions_where_the_greedy_tokens_agree():
    pair = tiny_pair(agreement_noise=0.5)
    texts = [[1, 5, 2, 9, 3, 7], [4, 4, 8]]
    target = greedy_tokens(pair.target, texts)
    assert target.shape == (9,) and agreement(target, target) == 1.0
    draft = greedy_tokens(pair.draft, texts)
    assert agreement(target, draft) == pytest.approx((target == draft).sum().item() / 9)
    same = tiny_pair(agreement_noise=0.0)  # a draft identical to its target
    assert agreement(greedy_tokens(same.target, texts), greedy_tokens(same.draft, texts)) == 1.0


def test_precisions_record_round_trips_through_json():
    decision = choose({"float32": flat(900)}, {"int8": 50.0}, agreeing(0.8, ("float32",), ("int8",)), AVX2)
    assert Precisions(**json.loads(json.dumps(decision.as_dict()))) == decision


# ---- greedy identity at a reduced precision ------------------------------------------------------------------------


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 4], [1, 2, 3]) == 2
    assert first_difference([1, 2], [1, 2, 3]) == 2  # a shorter output differs where it ends


def test_near_tie_bound_is_a_few_units_in_the_last_place():
    assert near_tie_bound(20.0, "bfloat16") == pytest.approx(0.5)  # grid 0.125 between 16 and 32
    assert near_tie_bound(40.0, "bfloat16") == pytest.approx(1.0)
    assert near_tie_bound(20.0, "float16") == pytest.approx(4 * 2 ** -6)
    assert near_tie_bound(20.0, "float32") == 0.0  # in float32 no difference is excused
    assert near_tie_bound(20.0, "int8") is None
    assert near_tie_bound(20.0, "int4") == near_tie_bound(20.0, "bfloat16")  # bfloat16 activations


def test_identity_report_reads_ars_margin_at_the_first_difference():
    rounds = [Round(0, 0, t, 1, 0.0, 0.1, top_logit=20.0, margin=m) for t, m in zip([5, 6, 7], [3.0, 0.125, 2.0])]
    assert identity_report([5, 6, 7], [5, 6, 7], rounds, "bfloat16")["identical_to_target"]
    report = identity_report([5, 9, 1], [5, 6, 7], rounds, "bfloat16")
    assert report == {"identical_to_target": False, "first_difference": 1, "margin_at_difference": 0.125,
                      "near_tie": True}
    assert identity_report([5, 6, 1], [5, 6, 7], rounds, "bfloat16")["near_tie"] is False  # margin 2: a bug
    assert identity_report([5, 9, 1], [5, 6, 7], rounds, "float32")["near_tie"] is False
