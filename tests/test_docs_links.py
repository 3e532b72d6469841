"""The documents' relative links hold: every target a link in the READMEs or docs/*.md names exists inside the
repository, and every `#anchor` is a heading of the file it points into (as GitHub names headings). Results move
between folders (data/<machine>/, data/archive/) and sections get renamed; a stale link is caught here rather than by
a reader."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", ROOT / "data" / "README.md", ROOT / "notebooks" / "README.md",
             *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
INLINE_LINK = re.compile(r"\]\(([^()\s]+)\)")  # [text](target) and ![alt](target)
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(\S+)")  # [name]: target, on a line of its own
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def without_code(text: str) -> str:
    """The text with fenced blocks dropped and code spans emptied: a link's target is never inside code, and a
    heading-like line in a fenced block is no heading (a link's text may be code: its `]( ... )` stays)."""
    return CODE_SPAN.sub("``", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: links reduced to their text, then lower case, every character but letters,
    digits, spaces, hyphens and underscores dropped, spaces made hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    """Every anchor a file's headings give, a repeated heading numbered as GitHub does (-1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def targets(text: str) -> list[str]:
    """Inline link targets, and reference definitions: lines of the form [name]: target that open a block (a line
    such as "[0.98, 1.05]: the ..." inside a paragraph is text, as in Markdown)."""
    plain = without_code(text)
    found = INLINE_LINK.findall(plain)
    previous = ""
    for line in plain.split("\n"):
        definition = REFERENCE.match(line)
        if definition and (not previous.strip() or REFERENCE.match(previous)):
            found.append(definition.group(1))
        previous = line
    return found


def broken_links(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """The relative links of one markdown file whose file or anchor is missing, each with what is wrong."""
    broken = []
    for target in targets(path.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: and the like: not checked here
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.is_relative_to(root):  # a clone holds the repository only
            broken.append(f"{target}: outside the repository")
        elif not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    return broken


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_exists(path):
    assert broken_links(path) == []


def test_a_missing_file_or_heading_is_reported(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (tmp_path / "elsewhere.md").write_text("# Elsewhere\n")  # there, but no clone holds it
    (repo / "other.md").write_text("# Title\n\n## Saguaro's C (b = 1)\n\n## Earlier\n\n## Earlier\n")
    page = repo / "page.md"
    page.write_text(
        "[ok](other.md#saguaros-c-b--1) [ok](other.md#earlier-1) [ok](#here) `[code](nowhere.md)`\n"
        "[0.98, 1.05]: an interval inside a paragraph, not a reference\n\n"
        "# Here\n\n[gone](missing.md) [stale](other.md#earlier-2) ![figure](fig.png) [web](https://example.com/x)\n"
        "[away](../elsewhere.md)\n\n[ref]: gone.md\n")
    assert broken_links(page, root=repo) == [
        "missing.md: no such file",
        "other.md#earlier-2: no heading #earlier-2 in other.md",
        "fig.png: no such file",
        "../elsewhere.md: outside the repository",
        "gone.md: no such file",
    ]
