"""llama.cpp as a peer on the same GGUF files the kit dequantizes: ``llamacpp-ar``, its target alone, and
``llamacpp-sd``, llama.cpp's own speculative decoding (its ``llama-speculative-simple`` tool, the draft model as
drafter, K fixed), with the methods' shape, so the bench runs them beside ``ar`` and ``sd`` on the same prompts.

llama.cpp runs the Q4_K_M weights as they are, so its target is not the kit's (a dequantized float32, bfloat16 or
int8 model): its answers are checked against ``llamacpp-ar`` (``ssd.bench.lossless.text_identity``), never against
``ar``. Both run greedy only, one prompt at a time, on as many threads as torch uses (the bench's ``--threads``).

Each call loads its models afresh (llama.cpp maps the file: a fraction of a second once the page cache holds it) and
times what llama.cpp does after loading, as the kit's methods are timed after theirs: the prompt's pass, then the
decode. ``llamacpp-sd`` reports its rounds only as totals (tokens drafted, accepted and decoded, from which its
rounds follow), which its trace carries in ``reported``.
"""
from __future__ import annotations

import os
import re
import subprocess
import time

import torch

from ..checks import check_gguf_pair
from ..core.decoding import batchable, check_prompts
from ..core.trace import Round, Trace
from ..models.gguf_store import gguf_file
from ..models.loading import PAIRS
from .build import ensure
from .engine import Engine

CONTEXT_SLACK = 16  # context beyond prompt + new tokens: a speculative round may look K tokens past the last


def gguf_pair(name: str) -> tuple:
    """(target, draft) GGUF files of a pair shipped as GGUF (the registered offline pairs), joined on first use."""
    check_gguf_pair(name, "llama.cpp")
    return gguf_file(PAIRS[name].target), gguf_file(PAIRS[name].draft)


def _one_greedy(method: str, prompts: list, config) -> None:
    if len(prompts) != 1:
        raise ValueError(f"{method} takes one prompt at a time, given {len(prompts)}")
    if config.temperature != 0:
        raise ValueError(f"temperature={config.temperature}: {method} runs greedy only (temperature 0)")


@batchable
def generate_llamacpp_ar(pair, prompts, config, generator: torch.Generator):
    """llama.cpp's target alone, greedy: the prompt's pass (whose last position gives the first token), then one
    token a step; stops at an end-of-generation token (kept, as the kit's AR keeps it) or at max_new_tokens."""
    prompts = check_prompts(pair, prompts, config)
    _one_greedy("llamacpp-ar", prompts, config)
    prompt, target = prompts[0], gguf_pair(pair.name)[0]
    n = len(prompt)
    trace = Trace("llamacpp-ar", prompt_len=n)
    with Engine(ensure(), target, threads=torch.get_num_threads(), n_batch=max(512, n),
                n_ctx=n + config.max_new_tokens + CONTEXT_SLACK) as engine:
        start = time.perf_counter()
        engine.decode(prompt, list(range(n)), [0] * n, [False] * (n - 1) + [True])
        _step(trace, engine, n - 1, start)
        trace.prefill_s, trace.prefill_tokens = time.perf_counter() - start, 1
        while len(trace.rounds) < config.max_new_tokens and not _ends(engine, pair, trace.rounds[-1].token):
            step = time.perf_counter()
            engine.decode([trace.rounds[-1].token], [n + len(trace.rounds) - 1], [0], [True])
            _step(trace, engine, 0, step)
        trace.wall_s = time.perf_counter() - start
    return [[r.token for r in trace.rounds]], [trace]


def _step(trace: Trace, engine: Engine, position: int, start: float) -> None:
    """The greedy token at a batch position, as an AR round with its margin (for the identity checks)."""
    token, top, margin = engine.top_two(position)
    trace.rounds.append(Round(draft_len=0, accepted=0, token=token, new_tokens=1, draft_s=0.0,
                              verify_s=time.perf_counter() - start, top_logit=top, margin=margin))


def _ends(engine: Engine, pair, token: int) -> bool:
    return token in pair.eos_token_ids or engine.is_end(token)


@batchable
def generate_llamacpp_sd(pair, prompts, config, generator: torch.Generator):
    """llama.cpp's speculative decoding, greedy: ``llama-speculative-simple`` with the pair's draft drafting exactly
    K tokens a round (``--spec-draft-n-max K --spec-draft-n-min 0 --spec-draft-p-min 0``: no early stop on the
    draft's confidence, as the kit's sd), on the prompt's text. Its answer comes back as text and is tokenized by
    llama.cpp again; its times (the prompt's pass, the decode) and totals are the tool's own."""
    prompts = check_prompts(pair, prompts, config)
    _one_greedy("llamacpp-sd", prompts, config)
    if not isinstance(config.k, int):
        raise ValueError(f"k={config.k!r}: llamacpp-sd drafts a fixed K; give an integer k")
    build, (target, draft) = ensure(), gguf_pair(pair.name)
    prompt = prompts[0]
    text = pair.tokenizer.decode(prompt, skip_special_tokens=False)
    with Engine(build, target, threads=1, n_ctx=len(prompt) + 8, n_batch=max(512, len(prompt))) as engine:
        if engine.tokenize(text) != prompt:  # the tool reads text: it must see the very tokens the kit's methods do
            raise ValueError("llamacpp-sd: llama.cpp tokenizes this prompt's text differently from the kit's "
                             "tokenizer, so it would decode another prompt")
        run = speculative_simple(build, target, draft, text, config, len(prompt))
        answer = engine.tokenize(run["text"]) if run["text"] else []
    if len(answer) < run["new_tokens"]:  # it counted an end-of-generation token it does not print; AR keeps one
        answer.append(pair.eos_token_ids[0])
    # The tool may run a round past max_new_tokens (it drafts a full K in its last rounds): keep the first
    # max_new_tokens, as every method does, and time them at the tool's own rate over all it decoded.
    kept = min(len(answer), config.max_new_tokens)
    decode_s = run["decode_s"] * min(1.0, kept / run["new_tokens"]) if run["new_tokens"] else run["decode_s"]
    trace = Trace("llamacpp-sd", prompt_len=len(prompt), wall_s=run["prompt_s"] + decode_s,
                  prefill_s=run["prompt_s"], prefill_tokens=0)
    trace.reported = {key: run[key] for key in ("drafted", "accepted", "rounds", "new_tokens")}
    return [answer[:kept]], [trace]


def speculative_simple(build, target, draft, text: str, config, prompt_tokens: int) -> dict:
    """Run llama.cpp's tool once; its answer's text and what it reported. The prompt goes as an argument, not a file
    (llama.cpp drops a prompt file's last newline, which a chat template ends with). The tool's loop ends once it
    has more than -n tokens, so -n is one below the tokens wanted."""
    threads = str(torch.get_num_threads())
    command = [str(build.tool("llama-speculative-simple")), "-m", str(target), "-md", str(draft), "-p", text,
               "-n", str(config.max_new_tokens - 1), "--temp", "0", "--seed", "0", "-t", threads, "-td", threads,
               "--spec-type", "draft-simple", "--spec-draft-n-max", str(config.k), "--spec-draft-n-min", "0",
               "--spec-draft-p-min", "0", "-c", str(prompt_tokens + config.max_new_tokens + CONTEXT_SLACK),
               "-b", str(max(512, prompt_tokens))]
    out = subprocess.run(command, capture_output=True, env=dict(os.environ, LD_LIBRARY_PATH=str(build.bin)))
    stdout, stderr = out.stdout.decode(errors="replace"), out.stderr.decode(errors="replace")
    if out.returncode:
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"llama-speculative-simple failed ({out.returncode}): {last}")
    return parse_speculative(stdout, stderr, text)


NUMBERS = {"prompt": r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds",
           "decode": r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds",
           "drafted": r"n_drafted\s*=\s*(\d+)", "accepted": r"n_accept\s*=\s*(\d+)"}


def parse_speculative(stdout: str, stderr: str, prompt_text: str) -> dict:
    """What llama-speculative-simple reported: on stdout a blank line, the prompt's text, then the answer's and two
    blank lines; on stderr its counts and times. Every round ends with one token of the target's own (recovered or
    bonus) after its accepted ones, so its rounds are its tokens less its accepted ones."""
    found = {key: re.search(pattern, stderr) for key, pattern in NUMBERS.items()}
    missing = [key for key in NUMBERS if not found[key]]
    if missing:
        raise RuntimeError(f"llama-speculative-simple printed no {', '.join(missing)} line")
    head = "\n\n" + prompt_text
    if not stdout.startswith(head):
        raise RuntimeError("llama-speculative-simple echoed another prompt than the one given")
    answer = stdout[len(head):]
    tail = "\n\n" * 2  # a blank line after the answer, and another when the tool ends
    if not answer.endswith(tail):
        raise RuntimeError("llama-speculative-simple's output does not end as this version's does")
    answer = answer[: -len(tail)]
    new_tokens, accepted = int(found["decode"][1]), int(found["accepted"][1])
    return {"text": answer, "prompt_s": float(found["prompt"][2]), "decode_s": float(found["decode"][2]),
            "new_tokens": new_tokens, "drafted": int(found["drafted"][1]), "accepted": accepted,
            "rounds": new_tokens - accepted}
