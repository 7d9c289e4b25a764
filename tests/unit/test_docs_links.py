"""Every link in README.md and docs/*.md leads somewhere inside the repository: a relative link
names a file (or directory) that exists, a ``#anchor`` names a heading of that page, and no link
leaves the repository (the project stands on its own). Pages move and headings get renamed; a
reader following a dead link from the README's first screen is the failure this catches."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation (but ``-`` and ``_``) dropped,
    spaces as ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings, with GitHub's ``-1``, ``-2`` for repeated ones."""
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(_FENCE.sub("", text)):
        base = anchor(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(text: str) -> list[str]:
    """The targets of a page's Markdown links, outside code."""
    return _LINK.findall(_CODE.sub("", _FENCE.sub("", text)))


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    problems = []
    text = page.read_text()
    for target in links(text):
        where = f"{page.relative_to(root)}: ({target})"
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            problems.append(f"{where} leaves the repository")
            continue
        path, _, frag = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.is_relative_to(root):
            problems.append(f"{where} leaves the repository")
        elif not dest.exists():
            problems.append(f"{where}: no such file")
        elif frag and (dest.suffix != ".md" or frag not in anchors(dest.read_text())):
            problems.append(f"{where}: no heading #{frag}")
    return problems


def test_every_link_of_the_readme_and_the_docs_resolves() -> None:
    problems = [p for page in PAGES for p in broken_links(page)]
    assert problems == [], "\n".join(problems)


def test_the_readme_first_screen_links_what_a_newcomer_looks_for() -> None:
    first_screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:40])
    targets = set(links(first_screen))
    for wanted in (
        "#two-commands-on-a-fresh-machine",
        "docs/spec-reference.md",
        "docs/design.md#compare_and_append",
        "docs/design.md#merge-engines-read-time-resolution",
        "docs/performance.md#todays-figures",
    ):
        assert wanted in targets, f"README's first 40 lines do not link {wanted}"


def test_the_check_finds_a_missing_file_a_missing_heading_and_an_outside_link(
    tmp_path: Path,
) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "# A page\n\n## Today's figures\n\n## Today's figures\n"
    )
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md#todays-figures) [ok](docs/a.md#todays-figures-1) [ok](#top)\n"
        "# Top\n"
        "`[code](nowhere.md)` [gone](docs/b.md) [typo](docs/a.md#today-figures)\n"
        "[out](https://example.com/x) [up](../elsewhere.md)\n"
        "```\n[fenced](nowhere.md)\n```\n"
    )

    assert broken_links(page, tmp_path) == [
        "README.md: (docs/b.md): no such file",
        "README.md: (docs/a.md#today-figures): no heading #today-figures",
        "README.md: (https://example.com/x) leaves the repository",
        "README.md: (../elsewhere.md) leaves the repository",
    ]
