"""What a machine found, in a sentence (ssd.analysis.verdicts): its words follow each ratio's 95% CI, it says only what
the page measured, and the README's sentences and glossary stand above its table, written from the same figures."""
from ssd.analysis import report_files, verdicts
from ssd.analysis.report import Figure, Page
from ssd.bench.machines import DATA


def ratio(key, value, low, high, prompts="humaneval"):
    return Figure(key, key, prompts, f"{value:.2f}x", f"[{low:.2f}, {high:.2f}]", "16 prompts", "f.json", value, low,
                  high, "sd")


def page_of(*figures):
    return Page("here", "this machine", [("bfloat16", "int8")], {("bfloat16", "int8"): list(figures)}, [])


def test_a_ratio_pays_loses_or_ties_by_its_interval():
    assert verdicts.word(ratio("sd/ar", 1.3, 1.1, 1.5)) == "pays"
    assert verdicts.word(ratio("sd/ar", 0.8, 0.7, 0.9)) == "loses"
    assert verdicts.word(ratio("sd/ar", 1.1, 0.95, 1.25)) == "ties"


def test_the_sentence_says_what_was_measured_and_nothing_else():
    pg = page_of(ratio("sd/ar", 2.19, 1.96, 2.42), ratio("sd/ar", 1.14, 0.98, 1.29, "prose"),
                 ratio("pipeline/sd-1core", 1.26, 1.20, 1.31), ratio("pipeline/sd", 0.82, 0.78, 0.85),
                 ratio("llamacpp-ar/ar", 4.43, 3.95, 4.90))
    assert verdicts.verdict(pg) == (
        "here: SD over AR pays on code (2.19x) and ties on prose (1.14x); SSD's pipeline beats SD only when SD gets "
        "one core (1.26x; 0.82x against SD on both cores); llama.cpp's AR on the same file runs 4.43x our AR, faster "
        "than our SD too.")
    assert verdicts.verdict(page_of(ratio("pipeline/sd", 0.68, 0.66, 0.71))) == (
        "here: SSD's pipeline loses against SD on both cores (0.68x).")
    assert verdicts.verdict(page_of(Figure("sd/ar", "SD over AR", "humaneval"))) == ""  # not measured: no sentence


def test_the_readme_says_what_each_machine_found_and_its_terms_above_the_table():
    pages = report_files.stored_pages(DATA)
    block = report_files.readme_block(pages)
    table = block.index("| figure |")
    assert block.index("What each machine found") < block.index("The table's terms:") < table
    for pg in pages:
        if not report_files._gpu(pg):
            sentence = verdicts.verdict(pg)
            assert sentence and " ".join(sentence.split()[:3]) in block[:table]
    for term, _ in verdicts.GLOSSARY:
        assert f"- {term}: " in block[:table]
