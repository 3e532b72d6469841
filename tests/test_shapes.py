"""ssd.models.shapes: the offline pair's architecture with random weights, for timing where its weights are not."""
import json
from types import SimpleNamespace

import pytest
import torch

from ssd.bench import gpu_check, graphs
from ssd.models import shapes
from ssd.models.gguf_store import ensure_cached
from ssd.models.loading import PAIRS
from ssd.core.theory import expected_tokens

SMALL = {"draft": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2),
         "target": dict(hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                        num_key_value_heads=2)}


@pytest.fixture
def small(monkeypatch):
    """The pair's registered name with tiny dimensions and vocabulary: the code path, in milliseconds."""
    monkeypatch.setitem(shapes.ARCHITECTURES, "qwen2.5-coder", SMALL)
    monkeypatch.setattr(shapes, "SHARED", shapes.SHARED | {"vocab_size": 100, "max_position_embeddings": 512})


@pytest.mark.real
@pytest.mark.parametrize("role", ["draft", "target"])
def test_the_stored_architecture_is_the_loaded_models(role):
    """What the GGUF loader makes of each model (its config.json in the weight cache) has the stored shapes."""
    loaded = json.loads((ensure_cached(getattr(PAIRS["qwen2.5-coder"], role), progress=False) / "config.json")
                        .read_text())
    made = shapes.config("qwen2.5-coder", role).to_dict()
    keys = list(shapes.ARCHITECTURES["qwen2.5-coder"][role]) + ["vocab_size", "tie_word_embeddings",
                                                                "max_position_embeddings", "model_type"]
    assert {k: made.get(k) for k in keys} == {k: loaded.get(k) for k in keys}
    assert loaded["architectures"] == ["Qwen2ForCausalLM"]  # the class ssd.models.shapes builds
    assert made["rms_norm_eps"] == pytest.approx(loaded["rms_norm_eps"])
    assert made["rope_parameters"]["rope_theta"] == loaded["rope_parameters"]["rope_theta"]


def test_a_random_pair_has_the_shapes_and_precisions_asked(small):
    pair = shapes.random_pair(target_dtype="bfloat16", draft_dtype="auto", layers=1)
    assert pair.name == "qwen2.5-coder (random weights)" and pair.tokenizer is None
    assert (pair.precisions.target, pair.precisions.draft) == ("bfloat16", "float32")  # auto on a CPU: float32
    assert pair.target.config.num_hidden_layers == pair.draft.config.num_hidden_layers == 1
    assert pair.target.config.hidden_size == 48 and pair.draft.config.hidden_size == 32
    assert pair.target.model.embed_tokens.weight.dtype == torch.bfloat16
    logits = pair.target(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert logits.dtype == torch.float32 and logits.shape == (1, 3, 100)  # a target keeps float32 logits


@pytest.mark.parametrize("name, value, message", [
    ("pair", "gpt2", "pair 'gpt2' has no stored architecture; allowed with random weights: 'qwen2.5-coder'"),
    ("target_dtype", "float64", "target_dtype"),
])
def test_bad_input_fails_fast_naming_the_parameter(name, value, message):
    args = {"name": value} if name == "pair" else {name: value}
    with pytest.raises(ValueError, match=message):
        shapes.random_pair(**args)


@pytest.mark.integration
def test_gpu_checks_profiles_of_the_shapes_at_each_batch_size(small, tmp_path):
    out = tmp_path / "shapes.json"
    gpu_check.profile_shapes("cpu", "float32", str(out), batches=(1, 2))
    result = json.loads(out.read_text())
    assert result["pair"] == "qwen2.5-coder (random weights)" and result["k"] == gpu_check.SHAPE_K
    assert [r["batch_size"] for r in result["rows"]] == [1, 2]
    for row in result["rows"]:
        profile = row["profile"]
        assert profile["batch_size"] == row["batch_size"] and profile["pair"] == result["pair"]
        assert row["c"] == pytest.approx(row["draft_step_ms"] / row["target_step_ms"])
        assert row["v"] == pytest.approx(profile["target_ms"]["5"] / profile["target_ms"]["1"])
        assert set(row["sd_speedup"]) == {str(a) for a in gpu_check.SHAPE_ACCEPTANCE}
        assert all(s > 0 for s in row["sd_speedup"].values())
        assert "graphs" not in row  # CUDA graphs are timed on CUDA alone


def test_graph_steps_give_c_v_and_sd_from_the_replayed_passes(monkeypatch):
    times = {("target", 1, False): 20.0, ("target", 5, False): 24.0, ("draft", 1, False): 19.0,
             ("target", 1, True): 4.0, ("target", 5, True): 5.0, ("draft", 1, True): 2.0}
    pair = SimpleNamespace(target="target", draft="draft")
    monkeypatch.setattr(graphs, "pass_ms", lambda model, b, new, graph: times[(model, new, graph)])
    steps = gpu_check.graph_steps(pair, 4)
    assert steps["static_cache_ms"]["eager"] == {"target_1": 20.0, "target_5": 24.0, "draft_1": 19.0}
    assert (steps["c"], steps["v"]) == (0.5, 1.25)
    assert steps["sd_speedup"]["0.9"] == pytest.approx(expected_tokens(0.9, 4) / (0.5 * 4 + 1.25))
