"""What a machine's page found, in one plain sentence, and the terms its table uses: written from the page's own
figures (``ssd.analysis.report``), so the words above the README's table cannot drift from the numbers in it.

A ratio's word follows its 95% CI: "pays" where the whole interval is above 1, "loses" where it is below, "ties"
where it holds 1; a figure without an interval (fewer than 3 prompts) is given by its value alone.
"""
from __future__ import annotations

from .report import FAST_WORDS, NOT_MEASURED, Figure, Page

# The table's terms, as a newcomer meets them (the README's glossary, under the sentences)
GLOSSARY = (
    ("a ratio (1.25x [1.16, 1.36])", "per answer, the two methods run side by side, then the geometric mean over "
                                     "the answers [its 95% CI]"),
    ("decode tokens/s", "the tokens after the prompt's pass over the time after it (the paper's measure); "
                        "whole-call tokens/s counts the prompt's pass too (a peer that does not time it)"),
    ("SD", "speculative decoding: K draft tokens, then one target pass that verifies them"),
    ("the pipeline", "SSD's two-rank loop: the drafter speculates on its own cores (or device) while the target "
                     "verifies"),
    ("sd-1core", "SD held to one core, as the pipeline's verifier is: the like-for-like baseline for a second "
                 "device that SD cannot use"),
    ("hit rate", "the share of rounds whose verification outcome the speculation cache had prepared (B = 4 "
                 "outcomes a round)"),
    ("break-even b", "the first batch size measured at which the method is no faster than AR batched as wide"),
    ("b*", "the first batch size at which the pipeline's fast backup (on a miss, the draft's next token) reaches "
           "its jit backup (on a miss, a fresh draft); predicted: by Theorem 7 from each b's profile"),
    ("near-tie", "a greedy difference from AR where AR's top two logits lie closer than the precision's rounding"),
    (FAST_WORDS, "both models' linear layers at the GGUF's 4 bits, their decoders through torch.compile "
                 "(`--target-dtype int4 --draft-dtype int4 --forward compiled`); every other row at auto's precision, "
                 "eager"),
)


def verdict(pg: Page) -> str:
    """One sentence of what the page's figures found at its first precision, from SD's pay on each prompt set, the
    pipeline against SD, and llama.cpp's AR where they were measured, then at the fastest forwards; '' where none
    was."""
    found = {(f.key, f.prompts): f for f in [*pg.figures[pg.precisions[0]], *pg.compiled] if f.value != NOT_MEASURED}
    clauses = [_sd(found), _pipeline(found), _llamacpp(found), _compiled(found)]
    clauses = [c for c in clauses if c]
    if not clauses:
        return ""
    return f"{pg.machine}: " + "; ".join(clauses) + "."


def word(f: Figure) -> str:
    """pays, loses or ties, by the figure's 95% CI (by its value where it has none)."""
    low, high = (f.low, f.high) if f.low is not None else (f.mean, f.mean)
    return "pays" if low > 1 else "loses" if high < 1 else "ties"


def _sd(found: dict) -> str:
    code, prose = found.get(("sd/ar", "humaneval")), found.get(("sd/ar", "prose"))
    parts = []
    if code:
        parts.append(f"{word(code)} on code ({code.value})")
    if prose:  # "pays on code (2.19x) and on prose (1.41x)": the word once where both say it
        same = code is not None and word(code) == word(prose)
        parts.append(f"{'' if same else word(prose) + ' '}on prose ({prose.value})")
    return "SD over AR " + " and ".join(parts) if parts else ""


def _pipeline(found: dict) -> str:
    one, both = found.get(("pipeline/sd-1core", "humaneval")), found.get(("pipeline/sd", "humaneval"))
    if one and both:
        if word(one) == "pays" and word(both) != "pays":
            return (f"SSD's pipeline beats SD only when SD gets one core ({one.value}; {both.value} against SD on "
                    "both cores)")
        return f"SSD's pipeline {word(one)} against SD on one core ({one.value}), {word(both)} on both ({both.value})"
    if both:
        return f"SSD's pipeline {word(both)} against SD on both cores ({both.value})"
    return f"SSD's pipeline {word(one)} against SD on one core ({one.value})" if one else ""


def _llamacpp(found: dict) -> str:
    theirs, ours = found.get(("llamacpp-ar/ar", "humaneval")), found.get(("sd/ar", "humaneval"))
    if not theirs:
        return ""
    beyond = (", faster than our SD too" if ours and theirs.mean > ours.mean else "")
    return f"llama.cpp's AR on the same file runs {theirs.value} our AR{beyond}"


def _compiled(found: dict) -> str:
    sd, theirs = found.get(("compiled:sd/ar", "humaneval")), found.get(("compiled:sd/llamacpp-ar", "humaneval"))
    parts = ([f"SD over AR {word(sd)} on code ({sd.value})"] if sd else []) + (
        [f"our SD runs {theirs.value} llama.cpp's AR"] if theirs else [])
    return f"{FAST_WORDS}, " + " and ".join(parts) if parts else ""


def glossary_lines() -> list[str]:
    return [f"- {term}: {meaning}." for term, meaning in GLOSSARY]
