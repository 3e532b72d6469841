"""Batches: every method decodes b prompts at once, one forward per step over all of them, and each sequence comes out
as it would alone: token-identical to AR on its prompt at temperature 0 (float32, ragged prompts, rows that accept
different counts), distributed as the target at temperature > 0 whatever its neighbours drew."""
import pandas as pd
import pytest
import torch
import transformers

from ssd.bench import run as bench
from ssd.core import cached_model
from ssd.bench.run import run_bench
from ssd.bench.summaries import summarize
from ssd.core.cached_model import CachedModel
from ssd.core.latencies import Profile
from ssd.core.tuning import Autotune
from ssd.bench.methods import generate_ar  # timed: a batch's rows share one wall_s
from ssd.core.decoding import DecodeConfig
from ssd.bench.lossless import ALPHA, chi_square_p, exact_target_distribution, sequence_index
from ssd.checks import parse_variant
from ssd.bench.methods import METHODS
from ssd.models.tiny import tiny_pair
from ssd.models.pair import Pair
from ssd.pipeline.launch import PipelineConfig, close_pipelines
from ssd.bench.prompts import Prompt, load_prompts
from ssd.core.speculation import SSDConfig
from ssd.models.tiny import ToyTokenizer

# Ragged: 1 to 14 tokens; the shortest and longest apart, so left padding and masking are exercised at every b.
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 1, 2], [3], [7, 7, 7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [2, 4]]
NEW = 24


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab_size=32, agreement_noise=0.4, seed=1)


def alone(pair, prompts, new=NEW):
    """AR on each prompt alone: the reference every row of every batch must equal."""
    return [generate_ar(pair, p, DecodeConfig(max_new_tokens=new), torch.Generator().manual_seed(0))[0] for p in prompts]


CONFIGS = {
    "ar": DecodeConfig(max_new_tokens=NEW),
    "hf-ar": DecodeConfig(max_new_tokens=NEW),
    "sd": DecodeConfig(k=4, max_new_tokens=NEW),
    "sd-1core": DecodeConfig(k=3, max_new_tokens=NEW),
    "ssd": SSDConfig(k=3, budget=6, max_new_tokens=NEW),
    "ssd:fast": SSDConfig(k=3, budget=4, backup="fast", max_new_tokens=NEW),
    "ssd:auto": SSDConfig(k="auto", budget="auto", fan_out_strategy="calibrated", max_new_tokens=NEW),
    "ssd:backup-auto": SSDConfig(k=3, budget=4, backup="auto", max_new_tokens=NEW),  # priced at each b's profile
}


def toy_profile(b: int) -> Profile:
    """Latencies timed over b rows: a pass over b times the tokens costs little more than over b."""
    return Profile("toy", {"target": "float32", "draft": "float32"}, {}, [0], [1], 128, {1: 10.0 * b, 9: 12.0 * b},
                   {1: 3.0 * b, 32: 4.0 * b}, {"target": 1.0, "draft": 1.0}, {"target": 1, "draft": 1}, batch_size=b)


@pytest.mark.parametrize("b", [1, 2, 5])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_row_of_a_ragged_batch_equals_ar_alone(pair, name, b):
    reference = alone(pair, PROMPTS[:b])
    options = {"autotune": Autotune({b: toy_profile(b)})} if "auto" in name else {}  # priced at b's profile
    tokens, traces = METHODS[name.split(":")[0]](pair, PROMPTS[:b], CONFIGS[name], torch.Generator().manual_seed(0),
                                                 **options)
    assert tokens == reference
    assert [t.batch_size for t in traces] == [b] * b and len({t.wall_s for t in traces}) == 1  # one call, shared
    if name.startswith("sd") or name.startswith("ssd"):
        drafted = sum(t.drafted for t in traces)
        assert 0 < sum(r.accepted for t in traces for r in t.rounds) < drafted  # rows rejected: holes were made


@pytest.mark.integration
def test_the_pipeline_decodes_a_batch_as_ssd_does_in_one_process(pair):
    """Each row equals AR alone, and the two ranks give generate_ssd's tokens and hits, at T = 0 and T = 1."""
    try:
        for temperature in (0.0, 1.0):
            config = PipelineConfig(k=3, budget=4, max_new_tokens=NEW, temperature=temperature)
            tokens, traces = METHODS["ssd-pipeline"](pair, PROMPTS, config, torch.Generator().manual_seed(3))
            same, same_traces = METHODS["ssd"](pair, PROMPTS, config, torch.Generator().manual_seed(3))
            assert tokens == same
            assert [r.hit for t in traces for r in t.rounds] == [r.hit for t in same_traces for r in t.rounds]
            if temperature == 0:
                assert tokens == alone(pair, PROMPTS)
    finally:
        close_pipelines()


def test_all_hit_says_whether_every_row_hit_that_round():
    close = tiny_pair()  # a draft close to its target: rows hit often, all of them now and then
    _, traces = METHODS["ssd"](close, PROMPTS[:3], SSDConfig(k=3, budget=6, max_new_tokens=NEW),
                               torch.Generator().manual_seed(0))
    rounds = [t.rounds for t in traces]
    for i in range(max(map(len, rounds))):
        live = [r[i] for r in rounds if i < len(r)]
        going = [r[i] for r in rounds if i + 1 < len(r)]  # a row in its last round waits for no draft
        assert all(r.all_hit == all(x.hit for x in going) for r in live)
    assert {r.all_hit for r in rounds[0]} == {True, False}  # both happen


# ---- the families users bring: positions learned (GPT-2), rotary (Llama, Qwen3, Phi-3, GPT-NeoX), from the mask (OPT)

VOCAB = 32


def tiny_model(family: str, noise: float) -> transformers.PreTrainedModel:
    torch.manual_seed(0)  # draft and target start from the same weights; the draft then gets noise
    T, common = transformers, dict(vocab_size=VOCAB, max_position_embeddings=128)
    attention = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, **common)
    model = {
        "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(n_embd=32, n_layer=2, n_head=2, n_positions=128,
                                                       vocab_size=VOCAB, bos_token_id=0, eos_token_id=0)),
        "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(num_key_value_heads=1, **attention)),
        "opt": lambda: T.OPTForCausalLM(T.OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                                    num_attention_heads=2, word_embed_proj_dim=32, **common)),
        "gpt-neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**attention)),
        "phi3": lambda: T.Phi3ForCausalLM(T.Phi3Config(num_key_value_heads=1, pad_token_id=0, eos_token_id=0,
                                                       **attention)),
        "qwen3": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(num_key_value_heads=1, head_dim=16, **attention)),
    }[family]()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)  # sharper distributions than the initialiser's: the greedy text does not settle on one token
            p.add_(noise * p.std() * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("family", ["gpt2", "llama", "opt", "gpt-neox", "phi3", "qwen3"])
def test_each_family_decodes_a_batch_token_identical_to_ar_alone(family):
    pair = Pair(tiny_model(family, 0.3), tiny_model(family, 0.0), ToyTokenizer(VOCAB), f"tiny-{family}")
    prompts = PROMPTS[:3]
    reference = alone(pair, prompts, new=16)
    for name, config in [("ar", DecodeConfig(max_new_tokens=16)), ("sd", DecodeConfig(k=3, max_new_tokens=16)),
                         ("ssd", SSDConfig(k=3, budget=4, max_new_tokens=16))]:
        tokens, traces = METHODS[name](pair, prompts, config, torch.Generator().manual_seed(0))
        assert tokens == reference, name
        if name != "ar":
            assert sum(r.accepted for t in traces for r in t.rounds) < sum(t.drafted for t in traces)  # rejections


# ---- the cache: holes masked, compacted or not, finished rows leave -------------------------------------------------


@pytest.mark.parametrize("fraction", [0.0, 1.0])  # compact at the first hole; never compact
def test_compacting_or_not_gives_the_same_tokens(pair, fraction, monkeypatch):
    monkeypatch.setattr(cached_model, "COMPACT_FRACTION", fraction)
    tokens, _ = METHODS["ssd"](pair, PROMPTS, CONFIGS["ssd"], torch.Generator().manual_seed(0))
    assert tokens == alone(pair, PROMPTS)


def test_a_rollback_masks_a_rows_tail_and_a_retired_row_leaves_the_batch(pair, monkeypatch):
    monkeypatch.setattr(cached_model, "COMPACT_FRACTION", 1.0)  # holes stay until compact() is called
    model = CachedModel(pair.target, rows=3)
    model.extend({0: [1, 2, 3, 4], 1: [5, 6], 2: [7, 8, 9]})  # right-aligned: row 1 padded by two, row 2 by one
    assert model.slots == 4 and [model.length(r) for r in range(3)] == [4, 2, 3]
    model.rollback(1, row=0)  # a rejected tail is masked: a hole the other rows' slots keep in place
    assert model.slots == 4 and model.valid.tolist() == [[True, False, False, False], [False, False, True, True],
                                                       [False, True, True, True]]
    model.rollback(1, row=1)
    model.rollback(2, row=2)  # now no row uses the last slot: it is cropped
    assert model.slots == 3 and model.valid.tolist() == [[True, False, False], [False, False, True],
                                                       [False, True, True]]
    model.compact()  # each row's valid slots to the right, the rest left padding
    assert model.slots == 2 and model.valid.tolist() == [[False, True], [False, True], [True, True]]
    model.retire(2)
    assert model.rows == [0, 1] and model.cache.layers[0].keys.shape[0] == 2
    logits = model.logits({0: [1, 9], 1: [5, 4]}, keep=1)  # each row's next logits, as alone
    for row, seq in ((0, [1, 9]), (1, [5, 4])):
        single = CachedModel(pair.target)
        torch.testing.assert_close(logits[row], single.logits(seq, keep=1), atol=1e-5, rtol=1e-5)


# ---- temperature > 0 -----------------------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("name", ["sd", "ssd"])
def test_each_row_of_a_sampled_batch_follows_the_target(name):
    """Two rows decoded together, each counted against its own prompt's exact target distribution."""
    small = tiny_pair(vocab_size=6, agreement_noise=0.2, seed=2)
    prompts, n_new, temperature, n = [[1, 4, 2], [3, 0, 5, 5, 1]], 3, 0.9, 1200
    config = (SSDConfig(k=2, budget=3, temperature=temperature, max_new_tokens=n_new) if name == "ssd"
              else DecodeConfig(k=2, temperature=temperature, max_new_tokens=n_new))
    counts = [torch.zeros(small.vocab_size**n_new) for _ in prompts]
    for seed in range(n):
        tokens, _ = METHODS[name](small, prompts, config, torch.Generator().manual_seed(seed))
        for row, out in enumerate(tokens):
            counts[row][sequence_index(out, small.vocab_size)] += 1
    for row, prompt in enumerate(prompts):
        assert chi_square_p(counts[row], exact_target_distribution(small, prompt, n_new, temperature)) > ALPHA


def test_one_seed_gives_a_batch_the_same_tokens(pair):
    config = SSDConfig(k=3, budget=4, temperature=1.0, max_new_tokens=NEW)
    first, _ = METHODS["ssd"](pair, PROMPTS, config, torch.Generator().manual_seed(7))
    again, _ = METHODS["ssd"](pair, PROMPTS, config, torch.Generator().manual_seed(7))
    other, _ = METHODS["ssd"](pair, PROMPTS, config, torch.Generator().manual_seed(8))
    assert first == again and first != other


# ---- bad input, the peer's limit, the bench -------------------------------------------------------------------------


def test_a_batch_is_refused_in_one_line_where_it_cannot_run(pair):
    with pytest.raises(ValueError, match=r"^hf-sd takes one prompt at a time, given 2: transformers' assisted") as e:
        METHODS["hf-sd"](pair, PROMPTS[:2], DecodeConfig(), torch.Generator())
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"^batch_size must be an integer >= 1, got 0"):
        run_bench(pair, load_prompts("prose[0:1]"), ["ar"], DecodeConfig(), batch_size=0)
    with pytest.raises(ValueError, match="batch_size is an integer >= 1, not 'auto'"):
        parse_variant("ar:batch_size=auto")
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        METHODS["sd"](pair, [[1, 2], []], DecodeConfig(), torch.Generator())


def test_a_set_that_does_not_divide_into_batches_ends_with_a_smaller_one_said_once(pair, capsys):
    result = run_bench(pair, load_prompts("prose[0:3]"), ["ar:batch_size=2"], DecodeConfig(max_new_tokens=4),
                       progress=False)
    assert [r["batch_size"] for r in result["rows"]] == [2, 2, 1]
    assert capsys.readouterr().err.count("3 prompts in groups of 2: the last group holds 1") == 1


def test_the_bench_runs_each_method_at_its_batch_size_side_by_side(pair):
    prompts = load_prompts("prose[0:4]")
    result = run_bench(pair, prompts, ["ar", "ar:batch_size=4", "sd:batch_size=2"], DecodeConfig(k=3, max_new_tokens=8),
                       progress=False)
    rows = {(r["method"], r["prompt_id"]): r for r in result["rows"]}
    batched = [r for (m, _), r in rows.items() if m == "ar:batch_size=4"]
    assert {r["batch_size"] for r in batched} == {4} and len({r["wall_s"] for r in batched}) == 1  # one call
    assert all(r["identical_to_target"] for r in result["rows"])
    summary = {s["method"]: s for s in result["summary"]}
    total = sum(r["new_tokens"] for r in batched) / batched[0]["wall_s"]  # the call's total tokens/s
    assert summary["ar:batch_size=4"]["tokens_per_s"] == pytest.approx(total)
    assert summary["sd:batch_size=2"]["batch_size"] == 2 and summary["ar"]["batch_size"] == 1
    again = summarize(pd.DataFrame(result["rows"]))  # stored rows summarise to the same figures
    assert [s["tokens_per_s"] for s in again] == [s["tokens_per_s"] for s in result["summary"]]


def test_the_backups_run_side_by_side_as_variants_of_one_bench(pair):
    prompts = load_prompts("prose[0:2]")
    methods = ["ssd:backup=jit", "ssd:backup=fast", "ssd:backup=auto:batch_size=2"]
    with pytest.raises(ValueError, match=r"^k, budget or backup is 'auto' but no autotune was given"):
        run_bench(pair, prompts, methods, SSDConfig(k=3, budget=2, max_new_tokens=12), progress=False)
    result = run_bench(pair, prompts, methods, SSDConfig(k=3, budget=2, max_new_tokens=12), progress=False,
                       autotune=Autotune({2: toy_profile(2)}))
    summary = {s["method"]: s for s in result["summary"]}
    assert all(r["identical_to_target"] for r in result["rows"])
    assert (summary[methods[0]]["fast_backup_share"], summary[methods[1]]["fast_backup_share"]) == (0.0, 1.0)
    assert 0.0 <= summary[methods[2]]["fast_backup_share"] <= 1.0 and summary[methods[2]]["batch_size"] == 2
    with pytest.raises(ValueError, match="backup must be one of jit, fast, auto; got 'slow'"):
        parse_variant("ssd:backup=slow")


def test_a_batch_that_does_not_fit_in_memory_is_refused_in_one_line(monkeypatch):
    pair = tiny_pair()
    real = pair.target.forward

    def forward(*args, **kwargs):
        if kwargs["input_ids"].shape[0] > 2:
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
                               "you tried to allocate 99999999999 bytes.\nmore of torch's message")
        return real(*args, **kwargs)

    monkeypatch.setattr(pair.target, "forward", forward)
    config = DecodeConfig(max_new_tokens=4)
    for method in ("ar", "sd"):
        with pytest.raises(ValueError, match=r"^batch_size=3: the batch did not fit in memory \(.*can't allocate "
                                             r"memory.*\); give a smaller batch_size") as e:
            METHODS[method](pair, PROMPTS[:3], config, torch.Generator().manual_seed(0))
        assert "\n" not in str(e.value)
        METHODS[method](pair, PROMPTS[:2], config, torch.Generator().manual_seed(0))  # two rows fit
    monkeypatch.setattr(pair.target, "forward", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("other")))
    with pytest.raises(RuntimeError, match="^other$"):  # any other error is not a memory one
        METHODS["ar"](pair, PROMPTS[:3], config, torch.Generator().manual_seed(0))


def test_the_bench_batches_prompts_of_similar_length(pair, monkeypatch):
    """Ordered by length before they are grouped: the prompts' pass of a batch pads little (all methods alike)."""
    calls = []
    real = bench.run_batch

    def spy(method, pair, contexts, config, seed, autotune=None):
        calls.append((method, [len(c) for c in contexts]))
        return real(method, pair, contexts, config, seed, autotune)

    monkeypatch.setattr(bench, "run_batch", spy)
    texts = ["a b c d e f g h i j k l", "a b", "a b c d e f g h i j k l m n", "a b c"]
    prompts = [Prompt(f"p/{i}", text, chat=False) for i, text in enumerate(texts)]
    result = run_bench(pair, prompts, ["ar", "ar:batch_size=2"], DecodeConfig(max_new_tokens=3), progress=False)
    short, long = [lengths for method, lengths in calls[2:] if method == "ar:batch_size=2"]  # after the warm-up
    assert max(short) < min(long)  # the two short prompts together, then the two long ones
    assert [r["prompt_id"] for r in result["rows"] if r["method"] == "ar"] == ["p/1", "p/3", "p/0", "p/2"]
    one = run_bench(pair, prompts, ["ar"], DecodeConfig(max_new_tokens=3), progress=False)
    assert [r["prompt_id"] for r in one["rows"]] == ["p/0", "p/1", "p/2", "p/3"]  # no batch: the given order
