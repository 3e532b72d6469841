"""How far llama.cpp's verify pass moves its target's greedy margins: what makes a difference between llamacpp-sd and
llamacpp-ar a near-tie rather than a bug.

llama.cpp multiplies 4-bit weights by activations it quantizes to 8 bits per block, through one kernel for a
one-token step and another for a pass over several tokens, which add in other orders. A greedy token can flip where
the target's top two logits nearly tie, as the kit's bfloat16 target's can (``ssd.bench.lossless``). ``margin_drift``
measures the scale of it on the answers AR gives: at every position, the top-2 margin of the one-token step against
the same two logits computed inside a pass over K + 1 tokens, as llama.cpp's speculative tool verifies. A first
difference whose AR margin is within twice the largest drift measured is a near-tie (the kit's rule for bfloat16).
"""
from __future__ import annotations

import numpy as np

from .engine import Engine


def step_logits(engine: Engine, prompt: list[int], answer: list[int]) -> list[np.ndarray]:
    """The target's logits for each answer position, as AR computes them: the prompt's pass, then one token a step."""
    engine.clear()
    n = len(prompt)
    engine.decode(prompt, list(range(n)), [0] * n, [False] * (n - 1) + [True])
    out = [engine.logits(n - 1).copy()]
    for i, token in enumerate(answer[:-1]):
        engine.decode([token], [n + i], [0], [True])
        out.append(engine.logits(0).copy())
    return out


def pass_logits(engine: Engine, prompt: list[int], answer: list[int], k: int) -> list[np.ndarray]:
    """The same logits computed inside passes over K + 1 tokens: the last prompt token and the first K answer
    tokens, then the next K + 1, ..., each pass keeping every position's logits, as a verify pass does."""
    engine.clear()
    n = len(prompt)
    engine.decode(prompt[:-1], list(range(n - 1)), [0] * (n - 1), [False] * (n - 1))
    feed, out = [prompt[-1]] + answer[:-1], []
    for start in range(0, len(feed), k + 1):
        chunk = feed[start : start + k + 1]
        engine.decode(chunk, [n - 1 + start + i for i in range(len(chunk))], [0] * len(chunk), [True] * len(chunk))
        out += [engine.logits(i).copy() for i in range(len(chunk))]
    return out


def margin_drift(engine: Engine, prompt: list[int], answer: list[int], k: int) -> list[float]:
    """Per answer position: |the top-2 margin inside a (K + 1)-token pass - the one-token step's|, of the two tokens
    the step ranks first and second."""
    drift = []
    for step, verify in zip(step_logits(engine, prompt, answer), pass_logits(engine, prompt, answer, k)):
        second, first = np.argpartition(step, -2)[-2:]
        drift.append(abs(float(verify[first] - verify[second]) - float(step[first] - step[second])))
    return drift


def measure(pair, prompts: list[list[int]], config, threads: int, progress: bool = True) -> dict:
    """margin_drift over llama.cpp's AR answers to `prompts` (token ids) at config's K and max_new_tokens: per
    prompt its positions and largest drift, and over all of them the largest, its 99th percentile and the near-tie
    bound it gives (twice the largest)."""
    from tqdm.auto import tqdm

    from .build import ensure
    from .peers import generate_llamacpp_ar, gguf_pair

    build, target = ensure(progress), gguf_pair(pair.name)[0]
    per_prompt, every = [], []
    for ids in tqdm(prompts, desc="llama.cpp margin drift", disable=not progress):
        answer, _ = generate_llamacpp_ar(pair, ids, config, None)
        with Engine(build, target, threads=threads, n_ctx=len(ids) + len(answer) + 16) as engine:
            drift = margin_drift(engine, ids, answer, config.k)
        per_prompt.append({"prompt_tokens": len(ids), "positions": len(drift), "max_drift": max(drift)})
        every += drift
    return {"k": config.k, "max_new_tokens": config.max_new_tokens, "prompts": per_prompt, "positions": len(every),
            "max_drift": max(every), "p99_drift": float(np.percentile(every, 99)), "near_tie_bound": 2 * max(every)}
