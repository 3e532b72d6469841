import dataclasses
import hashlib
import os
import subprocess
import sys
import threading
import time

import pytest
import torch
import transformers

from ssd.models import gguf_store, loading as models
from ssd.files import cache_lock
from ssd.models.gguf_store import GGUFSpec, ModelPartError, join_parts
from ssd.models.loading import load_pair
from ssd.models.pair import ModelLoadError, check_same_tokenizer
from ssd.models.tiny import tiny_pair


RUN_CACHE_DIR = os.environ.get("SSD_CACHE_DIR")  # read before private_cache replaces it


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    # No test may touch the user's real cache, unless it asks for it (the `real` test).
    monkeypatch.setenv("SSD_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


# --- tiny pairs ---------------------------------------------------------------------------------------------------


def greedy_agreement(pair, contexts):
    with torch.no_grad():
        return (pair.draft(contexts).logits[:, -1].argmax(-1)
                == pair.target(contexts).logits[:, -1].argmax(-1)).float().mean().item()


def random_contexts(n=256, length=12, vocab=16, seed=1):
    return torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(seed))


def test_tiny_pair_is_deterministic_for_a_seed():
    a, b, c = tiny_pair(seed=3), tiny_pair(seed=3), tiny_pair(seed=4)
    x = random_contexts(n=8)
    with torch.no_grad():
        assert torch.equal(a.target(x).logits, b.target(x).logits)
        assert torch.equal(a.draft(x).logits, b.draft(x).logits)
        assert not torch.equal(a.target(x).logits, c.target(x).logits)


def test_tiny_pair_shape_and_fields():
    pair = tiny_pair(vocab_size=20, max_context=64)
    assert (pair.vocab_size, pair.max_context, pair.name) == (20, 64, "tiny")
    assert pair.eos_token_ids == ()
    assert pair.tokenizer("ab")["input_ids"] == [ord("a") % 20, ord("b") % 20]  # the toy tokenizer: a char an id
    for m in (pair.draft, pair.target):
        assert not m.training and m.dtype == torch.float32
        assert not any(p.requires_grad for p in m.parameters())


def test_tiny_pair_builds_fast_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    start = time.perf_counter()
    tiny_pair()
    assert time.perf_counter() - start < 1.0
    assert torch.equal(torch.rand(3), expected)


def test_tiny_pair_distributions_are_peaked():
    pair = tiny_pair()
    with torch.no_grad():
        top = pair.target(random_contexts()).logits[:, -1].softmax(-1).max(-1).values
    # Neither near-uniform (1/16) nor one-hot: statistical tests of sampling need both.
    assert 0.3 < top.median().item() < 0.9


def test_greedy_agreement_falls_as_noise_rises():
    x = random_contexts()
    same, some, independent = (greedy_agreement(tiny_pair(agreement_noise=n), x) for n in (0.0, 0.3, 1.0))
    assert same == 1.0
    assert same > some > independent


@pytest.mark.parametrize("noise", [-0.1, 1.5, float("nan")])
def test_bad_agreement_noise_raises(noise):
    with pytest.raises(ValueError, match="agreement_noise"):
        tiny_pair(agreement_noise=noise)


def test_load_pair_tiny():
    assert load_pair("tiny").vocab_size == 16


def test_pair_refuses_different_vocab_sizes():
    small, big = tiny_pair(vocab_size=16), tiny_pair(vocab_size=17)
    with pytest.raises(ValueError, match="vocab_size 16.*vocab_size 17"):
        models.Pair(small.draft, big.target, None, "mixed")


# --- pair names -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["no-such-pair", "a,b,c", ",gpt2", ""])
def test_bad_pair_name(name):
    with pytest.raises(ValueError, match="pair") as err:
        load_pair(name)
    assert "qwen2.5-coder" in str(err.value) and "DRAFT_ID,TARGET_ID" in str(err.value)


def test_hub_ids_offline_fail_fast_and_clearly(monkeypatch):
    # Here the hub is unreachable; on a machine with internet, pretend it is, to test the offline message.
    monkeypatch.setattr(models, "_hub_reachable", lambda: False)
    start = time.perf_counter()
    with pytest.raises(RuntimeError) as err:
        load_pair("ssd-test/no-such-draft,ssd-test/no-such-target")
    assert time.perf_counter() - start < 10
    message = str(err.value)
    assert "ssd-test/no-such-draft" in message and "could not be reached" in message and "qwen2.5-coder" in message
    assert err.value.__cause__ is not None


def test_hub_probe_is_fast():
    start = time.perf_counter()
    models._hub_reachable.__wrapped__(timeout=2.0)
    assert time.perf_counter() - start < 5


def test_missing_local_folder_is_not_a_hub_id(tmp_path):
    folder = tmp_path / "empty-model"
    folder.mkdir()
    with pytest.raises(RuntimeError, match="local folder"):
        load_pair(f"{folder},{folder}")


# --- tokenizers -----------------------------------------------------------------------------------------------------


def word_tokenizer(words):
    from tokenizers import Tokenizer, models as tok_models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", *words])}
    tok = Tokenizer(tok_models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def test_same_tokenizer_passes():
    check_same_tokenizer(word_tokenizer(["a", "b"]), word_tokenizer(["a", "b"]), "d", "t")


def test_different_tokenizers_are_refused():
    with pytest.raises(ValueError, match="draft-model.*target-model"):
        check_same_tokenizer(word_tokenizer(["a", "b"]), word_tokenizer(["b", "a"]), "draft-model", "target-model")


def test_different_special_tokens_are_refused():
    draft, target = word_tokenizer(["a", "b"]), word_tokenizer(["a", "b"])
    target.eos_token = "b"
    with pytest.raises(ValueError, match="special tokens"):
        check_same_tokenizer(draft, target, "draft-model", "target-model")


# --- chunk packages, joining, cache ---------------------------------------------------------------------------------


def write_parts(folder, chunks):
    paths = []
    for i, chunk in enumerate(chunks, 1):
        paths.append(folder / f"part{i:02d}.bin")
        paths[-1].write_bytes(chunk)
    return paths


def test_join_parts_right_hash(tmp_path):
    chunks = [b"first-", b"second-", b"third"]
    dest = tmp_path / "joined.gguf"
    join_parts(write_parts(tmp_path, chunks), hashlib.sha256(b"".join(chunks)).hexdigest(), dest)
    assert dest.read_bytes() == b"first-second-third"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["joined.gguf", "part01.bin", "part02.bin", "part03.bin"]


def test_join_parts_wrong_hash_leaves_nothing(tmp_path):
    dest = tmp_path / "joined.gguf"
    with pytest.raises(ModelPartError, match="sha256") as err:
        join_parts(write_parts(tmp_path, [b"x", b"y"]), "0" * 64, dest, name="fake model")
    assert "fake model" in str(err.value) and "0" * 64 in str(err.value)
    assert hashlib.sha256(b"xy").hexdigest() in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part01.bin", "part02.bin"]


def fake_part_packages(root, chunks, prefix="ssd_fake_part"):
    """Chunk packages laid out as the real ones (module/data/partNN.bin), importable from root."""
    for i, chunk in enumerate(chunks, 1):
        data = root / f"{prefix}{i}" / "data"
        data.mkdir(parents=True)
        (data.parent / "__init__.py").write_text("raise RuntimeError('part packages must never be imported')\n")
        (data / f"part{i:02d}.bin").write_bytes(chunk)
    return gguf_store.chunks(prefix, len(chunks))


def test_missing_part_package_names_it(private_cache):
    spec = GGUFSpec("fake model", "fake", gguf_store.chunks("ssd_no_such_part_package", 2), 2, "0" * 64)
    with pytest.raises(ModelPartError, match="ssd_no_such_part_package1.*make install"):
        gguf_store.ensure_cached(spec, progress=False)
    assert not private_cache.exists()


def test_corrupted_part_caches_nothing(tmp_path, private_cache, monkeypatch):
    parts = fake_part_packages(tmp_path / "site", [b"abc", b"def"])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    spec = GGUFSpec("fake model", "fake", parts, 6, "f" * 64)
    with pytest.raises(ModelPartError, match="fake model.*sha256"):
        gguf_store.ensure_cached(spec, progress=False)
    assert list((private_cache / "models").iterdir()) == []


# A tiny GGUF written here stands in for the shipped Qwen files: the whole join -> dequantize -> cache path in a second.
TOKENS = ["a", "b", "c", "d", "\u0120", "ab", "cd", "abcd", "\u0120a", "<|endoftext|>", "<|im_end|>"]


def write_tiny_gguf(model, path):
    import gguf

    cfg = model.config
    tokens = TOKENS + [f"<|x{i}|>" for i in range(cfg.vocab_size - len(TOKENS))]
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name("tiny qwen2")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_embedding_length(cfg.hidden_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * 9 + [3] * (len(tokens) - 9))  # 3 = control (special) tokens
    w.add_token_merges(["a b", "c d", "ab cd", "\u0120 a"])
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, cfg.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        w.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), tensor.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def shipped_spec(tmp_path, monkeypatch, model, slug):
    """A GGUFSpec whose parts are fake chunk packages of a tiny GGUF of `model`."""
    blob = write_tiny_gguf(model, tmp_path / f"{slug}.gguf")
    third = len(blob) // 3
    parts = fake_part_packages(tmp_path / "site", [blob[:third], blob[third:2 * third], blob[2 * third:]],
                               prefix=f"ssd_fake_{slug}_part")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return GGUFSpec(f"tiny {slug}", slug, parts, len(blob), hashlib.sha256(blob).hexdigest())


def test_shipped_model_round_trip(tmp_path, private_cache, monkeypatch):
    model = tiny_pair().target
    spec = shipped_spec(tmp_path, monkeypatch, model, "roundtrip")
    folder = gguf_store.ensure_cached(spec, progress=False)
    assert folder == private_cache / "models" / "roundtrip"
    assert [p.name for p in (private_cache / "models").iterdir()] == ["roundtrip"]  # no work folder, no GGUF left
    assert not list(folder.glob("*.gguf"))
    cached, tokenizer = models._load_cached(spec, torch.float32, "cpu", progress=False, role="target")
    x = random_contexts(n=4)
    with torch.no_grad():
        assert torch.equal(cached(x).logits, model(x).logits)  # float32 GGUF -> safetensors is exact
    assert tokenizer.convert_ids_to_tokens(tokenizer("abcd a").input_ids) == ["abcd", "\u0120a"]
    assert not getattr(cached, "hf_quantizer", None) and "quantization_config" not in cached.config.to_dict()
    # A second call reads the cache: nothing is joined again.
    monkeypatch.setattr(gguf_store, "join_parts", lambda *a, **k: pytest.fail("joined twice"))
    assert gguf_store.ensure_cached(spec, progress=False) == folder


def test_registered_pair_loads_through_the_cache(tmp_path, monkeypatch):
    tiny = tiny_pair(agreement_noise=0.5)
    spec = models.PairSpec(shipped_spec(tmp_path, monkeypatch, tiny.draft, "d"),
                           shipped_spec(tmp_path, monkeypatch, tiny.target, "t"), extra_eos_tokens=("<|endoftext|>",))
    monkeypatch.setitem(models.PAIRS, "fake-pair", spec)
    pair = load_pair("fake-pair", target_dtype="float32", draft_dtype="float32", progress=False)
    assert (pair.name, pair.vocab_size, pair.max_context) == ("fake-pair", 16, 256)
    assert pair.eos_token_ids == (TOKENS.index("<|im_end|>"), TOKENS.index("<|endoftext|>"))
    x = random_contexts(n=4)
    with torch.no_grad():
        assert torch.equal(pair.draft(x).logits, tiny.draft(x).logits)
        assert torch.equal(pair.target(x).logits, tiny.target(x).logits)
    assert not pair.target.training and not any(p.requires_grad for p in pair.target.parameters())


def test_a_disk_too_full_for_the_cache_is_refused_before_joining(tmp_path, private_cache, monkeypatch):
    spec = dataclasses.replace(shipped_spec(tmp_path, monkeypatch, tiny_pair().target, "full"), cache_size=10**12)
    monkeypatch.setattr(gguf_store, "join_parts", lambda *a, **k: pytest.fail("joined on a full disk"))
    with pytest.raises(ModelLoadError, match=r"tiny full: building its float32 cache needs 1000\.0 GB free under .*"
                                             r"SSD_CACHE_DIR"):
        gguf_store.ensure_cached(spec, progress=False)
    assert list((private_cache / "models").iterdir()) == []


def test_interrupted_first_load_leaves_no_cache(tmp_path, private_cache, monkeypatch):
    spec = shipped_spec(tmp_path, monkeypatch, tiny_pair().target, "interrupted")

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(transformers.PreTrainedTokenizerBase, "save_pretrained", killed)  # after the weights
    with pytest.raises(KeyboardInterrupt):
        gguf_store.ensure_cached(spec, progress=False)
    assert list((private_cache / "models").iterdir()) == []


@pytest.mark.integration
def test_work_folder_of_a_dead_process_is_cleared(tmp_path, private_cache, monkeypatch):
    spec = shipped_spec(tmp_path, monkeypatch, tiny_pair().target, "stale")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = private_cache / "models" / f".stale.work-{int(dead.stdout)}-xyz"
    stale.mkdir(parents=True)
    (stale / "model.gguf").write_bytes(b"half a file")
    gguf_store.ensure_cached(spec, progress=False)
    assert [p.name for p in (private_cache / "models").iterdir()] == ["stale"]


def slowly(monkeypatch, module, name, calls):
    """Replace module.name by itself, counted in `calls` and held for half a second: a second thread that did not wait
    for the first would call it again meanwhile."""
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(name)
        time.sleep(0.5)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)


def in_two_threads(function, *args, **kwargs) -> list:
    results = [None, None]

    def run(i):
        results[i] = function(*args, **kwargs)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_two_loads_at_once_build_the_weights_once(tmp_path, private_cache, monkeypatch):
    # make test's workers each load the real pair on a fresh machine: one builds it, the other waits and reads it.
    spec = shipped_spec(tmp_path, monkeypatch, tiny_pair().target, "twice")
    builds = []
    slowly(monkeypatch, gguf_store, "_build", builds)
    folders = in_two_threads(gguf_store.ensure_cached, spec, progress=False)
    assert builds == ["_build"] and folders == [private_cache / "models" / "twice"] * 2


def test_two_loads_at_once_build_a_pairs_two_models_side_by_side(tmp_path, private_cache, monkeypatch):
    # On a fresh machine the second process builds the model the first is not building, rather than wait for it.
    tiny = tiny_pair()
    specs = [shipped_spec(tmp_path, monkeypatch, tiny.draft, "d3"),
             shipped_spec(tmp_path, monkeypatch, tiny.target, "t3")]
    built = []
    real = gguf_store._build

    def build(paths, models_folder, folder, spec, progress):
        built.append((spec.slug, threading.get_ident()))
        time.sleep(0.5)  # long enough for the other thread to find this model's lock held
        return real(paths, models_folder, folder, spec, progress)

    monkeypatch.setattr(gguf_store, "_build", build)
    in_two_threads(gguf_store.ensure_all_cached, specs, progress=False)
    assert sorted(slug for slug, _ in built) == ["d3", "t3"]  # each built once
    assert built[0][1] != built[1][1]  # by different threads, at once
    assert all(gguf_store.ensure_cached(spec, wait=False) == private_cache / "models" / spec.slug for spec in specs)


def test_a_lock_asked_without_waiting_says_it_is_held(private_cache):
    with cache_lock("busy") as first:
        held = []

        def ask():
            with cache_lock("busy", wait=False) as second:
                held.append(second)

        thread = threading.Thread(target=ask)
        thread.start()
        thread.join()
    assert first is True and held == [False]
    with cache_lock("busy", wait=False) as again:
        assert again is True


def test_two_loads_at_once_time_the_precisions_once(tmp_path, monkeypatch):
    tiny = tiny_pair()
    spec = models.PairSpec(shipped_spec(tmp_path, monkeypatch, tiny.draft, "d2"),
                           shipped_spec(tmp_path, monkeypatch, tiny.target, "t2"), extra_eos_tokens=())
    monkeypatch.setitem(models.PAIRS, "fake-pair", spec)
    timings = []
    slowly(monkeypatch, models, "_time_candidates", timings)
    pairs = in_two_threads(load_pair, "fake-pair", progress=False)
    assert timings == ["_time_candidates"]
    assert pairs[0].precisions.as_dict() == pairs[1].precisions.as_dict()


def test_registered_parts_are_found():
    # The real chunk packages are installed (make install); finding them runs none of their code.
    for spec in (models.PAIRS["qwen2.5-coder"].draft, models.PAIRS["qwen2.5-coder"].target):
        paths = gguf_store.part_paths(spec)
        assert sum(p.stat().st_size for p in paths) == spec.size


def test_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("SSD_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert gguf_store.cache_dir() == tmp_path / "xdg" / "ssd"
    monkeypatch.setenv("SSD_CACHE_DIR", str(tmp_path / "mine"))
    assert gguf_store.cache_dir() == tmp_path / "mine"


# --- the real pair ----------------------------------------------------------------------------------------------------


@pytest.mark.real
def test_real_qwen_pair(monkeypatch):
    # The cache this run was given (CI: an empty one of its own), else the user's: where every other real test loads
    # the pair from, so a fresh machine builds the weights once, not twice, and never in a cache it was not given.
    if RUN_CACHE_DIR:
        monkeypatch.setenv("SSD_CACHE_DIR", RUN_CACHE_DIR)
    else:
        monkeypatch.delenv("SSD_CACHE_DIR")
    pair = load_pair("qwen2.5-coder", progress=False)
    assert pair.draft.config.vocab_size == pair.target.config.vocab_size == pair.vocab_size
    ids = pair.tokenizer("def fib(n):").input_ids
    assert pair.tokenizer.decode(ids) == "def fib(n):"
    assert pair.eos_token_ids and pair.tokenizer.convert_tokens_to_ids("<|im_end|>") in pair.eos_token_ids
    assert pair.max_context >= 2048
