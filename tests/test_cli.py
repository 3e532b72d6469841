"""The command line: bad input fails fast with one line naming the parameter, before any model loads."""
import json

import pytest

from ssd.cli import main
from ssd.prompts import load_prompts


@pytest.mark.parametrize(
    "argv,message",
    [
        (["generate", "--prompt", "x", "-k", "0"], "k (the draft length K) must be an integer >= 1"),
        (["generate", "--prompt", "x", "--temperature", "-1"], "temperature must be a number >= 0"),
        (["generate", "--prompt", "x", "--method", "beam"], "method must be one of"),
        (["generate", "--prompt", "x", "--budget", "-2"], "budget (B, the number of cached outcomes)"),
        (["generate", "--prompt", "x", "--saguaro-c", "2"], "saguaro_c (C) must lie in [0, 1]"),
        (["generate", "--prompt", "x", "--fan-out", "zipf"], "fan_out must be one of"),
        (["generate", "--prompt", "x", "--backup", "slow"], "backup must be one of jit, fast"),
        (["bench", "--methods", "ar,beam"], "method must be one of"),
        (["bench", "--prompts", "mbpp:3"], "prompts must be one of humaneval, prose"),
        (["bench", "--threads", "0"], "threads must be >= 1"),
        (["generate", "--prompt", "x", "--pair", "nope"], "pair 'nope' is not known"),
        (["hit-rates", "--saguaro-c", "0.5"], "exact only with --backup jit and --saguaro-c 1"),
    ],
)
def test_bad_arguments_fail_fast_with_a_clear_message(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_prompt_specs(tmp_path):
    assert [p.id for p in load_prompts("humaneval[3:5]")] == ["HumanEval/3", "HumanEval/4"]
    assert len(load_prompts("humaneval:7")) == 7 and len(load_prompts("prose")) == 16
    path = tmp_path / "spec.jsonl"
    rows = [{"question_id": 81, "category": "writing", "turns": ["Write a haiku.", "Again."]},
            {"question_id": 82, "category": "math", "turns": ["What is 2 + 2?"]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    prompts = load_prompts(f"{path}:1")
    assert [(p.id, p.text, p.chat) for p in prompts] == [("81", "Write a haiku.", True)]
    path.write_text('{"turns": []}\n')
    with pytest.raises(ValueError, match="not a Spec-Bench row"):
        load_prompts(str(path))
    with pytest.raises(ValueError, match="selects no prompt"):
        load_prompts("humaneval[500:]")
