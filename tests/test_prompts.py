"""Prompt sets in Spec-Bench's format: categories, every turn, @N per category, later turns after their answers, and
the bench's per-category report on a tiny pair."""
import json
import math
from pathlib import Path

import pytest
import torch

from ssd import DecodeConfig, checks, generate_ar, tiny_pair
from ssd.core.decoding import batchable
from ssd.bench.records import load_rows
from ssd.bench.run import run_bench
from ssd.cli import main
from ssd.bench.methods import METHODS
from ssd.models.tiny import ToyTokenizer
from ssd.bench.prompts import TURN_SEPARATOR, Prompt, encode, first_turns, load_prompts

# Hand-written rows of every Spec-Bench task kind: MT-bench (writing, two turns each), translation, summarization, qa,
# math_reasoning, rag; 9 rows, categories in file order.
SPEC_BENCH = str(Path(__file__).parent / "data" / "spec_bench.jsonl")
CATEGORIES = ["writing", "translation", "summarization", "qa", "math_reasoning", "rag"]


def test_a_spec_bench_row_keeps_its_category_and_every_turn():
    prompts = load_prompts(SPEC_BENCH)
    assert [p.id for p in prompts] == [str(i) for i in range(1, 10)]
    assert list(dict.fromkeys(p.category for p in prompts)) == CATEGORIES
    first = prompts[0]
    assert first.chat and len(first.turns) == 2 and first.text == first.turns[0]
    assert first.turns[1].startswith("Rewrite your previous answer")
    assert all(len(p.turns) == 1 for p in prompts if p.category != "writing")
    assert [len(p.turns) for p in first_turns(prompts)] == [1] * 9
    assert {p.category for p in load_prompts("humaneval:2") + load_prompts("prose:2")} == {"humaneval", "prose"}


def test_at_n_takes_the_first_n_of_each_category_in_file_order():
    assert [p.id for p in load_prompts(f"{SPEC_BENCH}@1")] == ["1", "3", "5", "6", "8", "9"]
    assert [p.id for p in load_prompts(f"{SPEC_BENCH}@2")] == [str(i) for i in range(1, 10)]
    assert [p.id for p in load_prompts(f"{SPEC_BENCH}@5")] == [str(i) for i in range(1, 10)]
    assert [p.id for p in load_prompts("humaneval@3")] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]


@pytest.mark.parametrize(
    "suffix,message",
    [("@0", "@N takes N >= 1 prompts per category"), ("@x", "@N takes one integer N >= 1"),
     ("@2:3", "@N takes one integer N >= 1"), ("@-1", "@N takes one integer N >= 1")],
)
def test_a_bad_per_category_spec_fails_with_one_line_naming_it(suffix, message, capsys):
    with pytest.raises(ValueError, match=message) as e:
        load_prompts(SPEC_BENCH + suffix)
    assert repr(SPEC_BENCH + suffix) in str(e.value) and "\n" not in str(e.value)
    assert main(["bench", "--pair", "tiny", "--prompts", SPEC_BENCH + suffix]) == 2
    assert capsys.readouterr().err.startswith(f"error: prompts spec {SPEC_BENCH + suffix!r}")


def test_an_unknown_set_names_every_selection_allowed():
    with pytest.raises(ValueError, match=r"got 'nope@2'") as e:
        load_prompts("nope@2")
    assert all(s in str(e.value) for s in (":N", "[a:b]", "@N"))


def test_a_later_turn_holds_the_answer_before_it_in_plain_text():
    tokenizer = ToyTokenizer(16)
    prompt = load_prompts(SPEC_BENCH)[0]
    turn1, answer = encode(tokenizer, prompt), [3, 1, 4, 1, 5]
    turn2 = encode(tokenizer, prompt, [answer])
    follow = tokenizer(TURN_SEPARATOR + prompt.turns[1], add_special_tokens=False)["input_ids"]
    assert turn2 == turn1 + answer + follow
    with pytest.raises(ValueError, match="has 2 turn"):
        encode(tokenizer, prompt, [answer, answer])


class TemplateTokenizer(ToyTokenizer):
    """A character tokenizer with a chat template of its own: <role>content</role>, then <assistant> to answer."""

    chat_template = "<role>content</role>"

    def __init__(self, vocab_size: int, rewrite=lambda content: content):
        super().__init__(vocab_size)
        self.rewrite = rewrite

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [ord(c) % self.vocab_size for c in text]}

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and not tokenize
        text = "".join(f"<{m['role']}>{self.rewrite(m['content'])}</{m['role']}>" for m in messages)
        return text + "<assistant>"


def test_a_later_turn_goes_through_the_chat_template_with_the_answer_ids_as_generated():
    tokenizer = TemplateTokenizer(97)
    prompt = Prompt("7", "Hi", chat=True, category="writing", follow_ups=("More",))
    answer = [90, 91, 92]  # ids no text would give: they must go in as they are
    turn1, turn2 = encode(tokenizer, prompt), encode(tokenizer, prompt, [answer])
    ids = lambda text: tokenizer(text)["input_ids"]  # noqa: E731
    assert turn1 == ids("<user>Hi</user><assistant>")
    assert turn2 == turn1 + answer + ids("</assistant><user>More</user><assistant>")
    upper = TemplateTokenizer(97, rewrite=str.upper)  # a template that changes what the assistant said
    with pytest.raises(ValueError, match="--first-turns"):
        encode(upper, prompt, [answer])


def test_each_method_answers_turn_two_after_its_own_answer_to_turn_one(monkeypatch):
    pair = tiny_pair()
    prompt = load_prompts(SPEC_BENCH)[0]
    config = DecodeConfig(max_new_tokens=6)
    turn1 = encode(pair.tokenizer, prompt)
    seen = []

    @batchable
    def other(pair, prompts, config, generator):
        """AR, except that on turn 1 it answers every token one id above AR's: an answer AR would not give."""
        (ids,) = prompts  # the bench's batch size is 1
        seen.append(list(ids))
        tokens, trace = generate_ar(pair, ids, config, generator)
        if ids == turn1:
            tokens = [(t + 1) % pair.vocab_size for t in tokens]
        return [tokens], [trace]

    monkeypatch.setitem(METHODS, "other", other)
    monkeypatch.setattr(checks, "METHOD_NAMES", checks.METHOD_NAMES + ("other",))  # the names a user may give
    rows = run_bench(pair, [prompt], ["ar", "other"], config, progress=False)["rows"]
    greedy = lambda ids: generate_ar(pair, ids, config, torch.Generator().manual_seed(0))[0]  # noqa: E731
    ar1 = greedy(turn1)
    own1 = [(t + 1) % pair.vocab_size for t in ar1]
    assert seen[-1] == encode(pair.tokenizer, prompt, [own1]) and seen[-1][len(turn1):][:len(own1)] == own1
    ar_context = encode(pair.tokenizer, prompt, [ar1])
    assert greedy(ar_context) != greedy(seen[-1])  # so "other"'s turn 2 is identical only to AR from its own context
    by = {(r["prompt_id"], r["method"]): r for r in rows}
    assert sorted(by) == [("1", "ar"), ("1", "other"), ("1/turn2", "ar"), ("1/turn2", "other")]
    assert [by[("1/turn2", m)]["turn"] for m in ("ar", "other")] == [2, 2] and rows[0]["category"] == "writing"
    assert by[("1", "other")]["identical_to_target"] is False and by[("1", "other")]["first_difference"] == 0
    assert by[("1/turn2", "other")]["identical_to_target"] is True
    assert by[("1/turn2", "ar")]["prompt_tokens"] == len(ar_context)
    assert by[("1/turn2", "other")]["prompt_tokens"] == len(seen[-1])


def test_the_bench_reports_every_category_and_overall(tmp_path, capsys):
    path = str(tmp_path / "bench.json")
    argv = ["bench", "--pair", "tiny", "--methods", "ar,sd", "--prompts", f"{SPEC_BENCH}@2", "--max-new-tokens", "6",
            "--json", path]
    assert main(argv) == 0
    out = capsys.readouterr().out
    table = out.split("per category")[1].split("\n\n")[0].splitlines()[2:]  # up to the breakdown after it
    assert "where the time went" in out and "against the peers" not in out  # no peer ran
    assert [line.split()[:2] for line in table] == [[c, m] for c in [*CATEGORIES, "overall"] for m in ("ar", "sd")]
    with open(path) as f:
        result = json.load(f)
    rows = {(r["prompt_id"], r["method"]): r for r in result["rows"]}
    assert {p for p, _ in rows} >= {"1/turn2", "2/turn2"} and all(r["identical_to_target"] for r in rows.values())
    report = {(c["category"], c["method"]): c for c in result["categories"]}
    assert [report[(c, "sd")]["answers"] for c in [*CATEGORIES, "overall"]] == [4, 2, 1, 2, 1, 1, 11]
    # An interval from 3 answers on (writing's four: two questions, two turns each), none from fewer.
    assert report[("writing", "sd")]["tokens_per_s_ci"] and report[("overall", "sd")]["speedup_vs_ar_ci"]
    assert all(report[(c, "sd")][f"{v}_ci"] is None for c in CATEGORIES[1:] for v in ("tokens_per_s",
                                                                                        "speedup_vs_ar"))
    # The speed-up is the geometric mean of per-answer ratios to AR on the same answer; AR's tokens per round are 1.
    writing = [p for p, m in rows if m == "sd" and rows[(p, m)]["category"] == "writing"]
    ratios = [rows[(p, "sd")]["tokens_per_s"] / rows[(p, "ar")]["tokens_per_s"] for p in writing]
    assert report[("writing", "sd")]["speedup_vs_ar"] == pytest.approx(math.prod(ratios) ** (1 / len(ratios)))
    assert report[("overall", "ar")]["speedup_vs_ar"] == 1 and report[("overall", "ar")]["tokens_per_round"] == 1
    sd = [r for r in rows.values() if r["method"] == "sd"]
    assert report[("overall", "sd")]["tokens_per_round"] == pytest.approx(
        sum(r["new_tokens"] / r["rounds"] for r in sd) / len(sd))


def test_first_turns_answers_each_row_once(tmp_path):
    path = str(tmp_path / "bench.json")
    argv = ["bench", "--pair", "tiny", "--methods", "ar", "--prompts", f"{SPEC_BENCH}@1", "--max-new-tokens", "4",
            "--first-turns", "--json", path]
    assert main(argv) == 0
    rows = load_rows(path)
    assert list(rows.prompt_id) == ["1", "3", "5", "6", "8", "9"] and (rows.turn == 1).all()


def test_a_set_of_one_category_prints_its_summary_and_the_overall_rows(capsys):
    argv = ["bench", "--pair", "tiny", "--methods", "ar,sd", "--prompts", "prose[0:3]", "--max-new-tokens", "4"]
    assert main(argv) == 0
    summary, report = capsys.readouterr().out.split("per category")
    assert [line.split()[0] for line in summary.strip().splitlines()] == ["method", "ar", "sd"]
    rows = [line.split() for line in report.split("\n\n")[0].splitlines()[2:]]
    assert [row[:3] for row in rows] == [["overall", "ar", "3"], ["overall", "sd", "3"]]
    # Three answers give intervals: tokens/s and tokens per round for both, the speed-up for sd only (AR's is 1).
    assert [sum(cell.startswith("[") for cell in row) for row in rows] == [2, 3]
