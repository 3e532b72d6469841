"""llama.cpp's regime: the kit's latency curves (``ssd.core.latencies.Profile``) measured on llama.cpp's kernels, on
the same GGUF files, so that SD's E / (cK + v) and Theorem 7 price that engine as they price the kit's
(``python -m ssd profile --engine llama.cpp``).

The curves are the PyTorch profile's (``ssd.bench.profile``), timed through llama.cpp's batches
(``ssd.llamacpp.engine``): the target's pass over n tokens in each of b sequences after a cached context (logits at
every position, as a verify pass needs them); one depth of a tree over n branch rows for each of b sequences, each
row a sequence of its own that shares the context's cache entries (``Engine.copy``) and whose logits are read and
argmaxed (the draw); and the glue step, the draft's pass over n tokens with logits at the last. llama.cpp sizes its
thread pool per context, so a profile's core set is its thread count (the process is not pinned: on an idle machine
one thread runs alone on a core, as each rank of the pipeline would); one on one thread per model prices the
pipeline's ranks, one on every core SD and AR on the whole machine, as llama.cpp's tools run them. At b = 1 it also
replays one round of llama.cpp's speculative tool on the two engines (``replay_round``): what the curves add up to
once the models take turns, beside what the tool's rounds take in a bench (``ssd.analysis.engines.sd_check``).
"""
from __future__ import annotations

import time

import gguf
import numpy as np
from tqdm.auto import tqdm

from ..core.latencies import Profile
from ..llamacpp.build import VERSION, ensure
from ..llamacpp.engine import Engine
from ..llamacpp.peers import gguf_pair
from ..models.capability import capability
from ..models.timing import CONTEXT, round_robin_ms
from .machines import commit
from .profile import DRAFT_ROWS, TARGET_TOKENS, memory_bandwidth_gbs

ENGINE = "llama.cpp"
MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ: a tree at batch size b keeps b x rows within it
REPLAYED_K = 4  # the K of the speculative round a b = 1 profile replays (the benches' K)


def gguf_type(path) -> str:
    """The GGUF file's quantization as llama.cpp names it (general.file_type), e.g. 'Q4_K_M'."""
    reader = gguf.GGUFReader(str(path))
    field = reader.fields.get("general.file_type")
    value = int(field.parts[field.data[0]][0]) if field else None
    return gguf.LlamaFileType(value).name.removeprefix("MOSTLY_") if value is not None else "GGUF"


def gguf_step_bytes(path) -> int:
    """Bytes a one-token step reads: every tensor but the token embedding table (one row of it is read), unless the
    output layer is that table (no output.weight)."""
    tensors = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors}
    untied = "output.weight" in tensors
    return sum(tensors.values()) - (tensors.get("token_embd.weight", 0) if untied else 0)


def _filled(engine: Engine, sequences: int, context: int) -> None:
    """`context` fixed tokens in sequence 0, shared by sequences 1..sequences-1."""
    engine.clear()
    ids = [(7 * i + 11) % engine.n_vocab for i in range(context)]
    engine.decode(ids, list(range(context)), [0] * context, [False] * (context - 1) + [True])
    for seq in range(1, sequences):
        engine.copy(0, seq)


def pass_curve(engine: Engine, sizes, context: int, reps: int, batch: int, every: bool = True) -> dict[int, float]:
    """ms of a pass over n tokens in each of `batch` sequences after the context: with every, each position's logits
    kept (the target's verify pass); else each sequence's last (the draft's glue step)."""
    _filled(engine, batch, context)

    def run(n):
        seqs = [s for s in range(batch) for _ in range(n)]
        positions = [context + i for _ in range(batch) for i in range(n)]
        outputs = [every or i == n - 1 for _ in range(batch) for i in range(n)]
        engine.decode([(13 * p + 5) % engine.n_vocab for p in positions], positions, seqs, outputs)

    def undo(n):
        for s in range(batch):
            engine.remove(s, context)

    return round_robin_ms(sizes, reps, "cpu", run, undo)


def tree_curve(engine: Engine, rows, context: int, reps: int, batch: int) -> dict[int, float]:
    """ms of one depth of a tree: n branch rows for each of `batch` sequences, each row its own sequence after the
    shared context, its logits read and argmaxed."""
    _filled(engine, batch * max(rows), context)

    def run(n):
        seqs = list(range(batch * n))
        engine.decode([(17 * s + 3) % engine.n_vocab for s in seqs], [context] * len(seqs), seqs, [True] * len(seqs))
        for i in range(len(seqs)):
            engine.argmax(i)

    def undo(n):
        for s in range(batch * n):
            engine.remove(s, context)

    return round_robin_ms(rows, reps, "cpu", run, undo)


def replay_round(target: Engine, draft: Engine, k: int, context: int, reps: int) -> dict:
    """One round of llama.cpp's speculative tool (draft-simple) replayed on these engines, ms (median of reps after
    a warm-up): the draft's pass over the batch the target verified (K + 1 tokens, logits at the last), K draft
    steps each argmaxed, the target's pass over K + 1 tokens with every position argmaxed; both caches cut back to the
    context after each. What the profile's curves add up to once the two models take turns on the same cores."""
    _filled(target, 1, context)
    _filled(draft, 1, context)
    batch, positions = [(23 * i + 9) % target.n_vocab for i in range(k + 1)], list(range(context, context + k + 1))
    times = {"process": [], "draft": [], "verify": [], "round": []}
    for rep in range(reps + 1):
        start = time.perf_counter()
        draft.decode(batch, positions, [0] * (k + 1), [False] * k + [True])
        processed = time.perf_counter()
        draft.remove(0, context)
        token = batch[0]
        for i in range(k):
            draft.decode([token], [context + i], [0], [True])
            token = draft.argmax(0)
        drafted = time.perf_counter()
        target.decode(batch, positions, [0] * (k + 1), [True] * (k + 1))
        for i in range(k + 1):
            target.argmax(i)
        verified = time.perf_counter()
        target.remove(0, context)
        draft.remove(0, context)
        if rep:
            for key, seconds in (("process", processed - start), ("draft", drafted - processed),
                                 ("verify", verified - drafted), ("round", verified - start)):
                times[key].append(seconds)
    return {"k": k} | {key: float(np.median(v) * 1000) for key, v in times.items()}


def measure(pair: str, *, threads: int = 1, tokens=TARGET_TOKENS, rows=DRAFT_ROWS, context: int = CONTEXT,
            reps: int = 5, progress: bool = True, batch_size: int = 1) -> Profile:
    """llama.cpp's profile of a registered GGUF pair (by name) on `threads` threads per model, every pass over
    batch_size sequences."""
    build, (target_file, draft_file) = ensure(progress), gguf_pair(pair)
    rows = tuple(n for n in rows if batch_size * n <= MAX_SEQUENCES)
    bar = tqdm(total=2 * len(tokens) + len(rows), desc=f"llama.cpp profile, {threads} thread(s)", disable=not progress)
    size = context + max(tokens) + 8
    trees = batch_size * max(rows)
    with Engine(build, target_file, threads=threads, n_ctx=batch_size * size, sequences=batch_size,
                n_batch=max(512, batch_size * max(tokens))) as target, \
         Engine(build, draft_file, threads=threads, n_ctx=context + trees + batch_size * size, sequences=trees,
                n_batch=max(512, trees, batch_size * max(tokens))) as draft:
        target_ms = pass_curve(target, tokens, context, reps, batch_size)
        bar.update(len(tokens))
        draft_ms = tree_curve(draft, rows, context, reps, batch_size)
        bar.update(len(rows))
        glue = pass_curve(draft, tokens, context, reps, batch_size, every=False)
        bar.update(len(tokens))
        round_ms = replay_round(target, draft, REPLAYED_K, context, reps) if batch_size == 1 else None
    bar.close()
    cores = list(range(threads))
    bandwidth = memory_bandwidth_gbs()  # the same memory either model reads from
    kinds = {"target": gguf_type(target_file), "draft": gguf_type(draft_file)}
    return Profile(pair, kinds, capability() | {"llama_cpp_python": VERSION}, cores, cores, context, target_ms,
                   draft_ms, {"target": bandwidth, "draft": bandwidth},
                   {"target": gguf_step_bytes(target_file), "draft": gguf_step_bytes(draft_file)},
                   time.strftime("%Y-%m-%dT%H:%M:%S"), glue, batch_size, commit=commit(), engine=ENGINE,
                   round_ms=round_ms)
