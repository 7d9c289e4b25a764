"""Every link in README.md and docs/*.md leads somewhere inside the repository: a relative link
names a file (or directory) that exists, a ``#anchor`` names a heading of that page, and no link
leaves the repository (the project stands on its own). Pages move and headings get renamed; a
reader following a dead link from the README's first screen is the failure this catches.

The code cites the docs too (``docs/design.md, "Merge engines"`` in a docstring, an error
message naming ``docs/sources.md, 'The files source'``): every ``.md`` file a source, test,
benchmark or page names exists, and every cited section is a heading of that page. Nine places
once pointed to a DESIGN.md that was never in the repository."""

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


# -- what the code and the pages cite --------------------------------------------------------

_MD_NAME = re.compile(r"(?<![\w./-])((?:\.\./|docs/)?[\w-]+\.md)\b")
_CITATION = re.compile(r"((?:docs/)?[\w-]+\.md),? \(?[\"']([^\"'\n]{3,80})[\"']")
#: A run-in section: a paragraph or list item that starts with bold text.
_RUN_IN = re.compile(r"^(?:\* )?\*\*(.+?)\*\*", re.M)
#: This file's own examples of what the checks refuse.
_SELF = Path(__file__).resolve()


def cited_files(root: Path = ROOT) -> list[Path]:
    files = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    for tree in ("src", "tests", "bench"):
        files += sorted((root / tree).rglob("*.py"))
    return [f for f in files if f.resolve() != _SELF]


def citation_problems(root: Path = ROOT) -> list[str]:
    """``.md`` names that are no file of the repository, and ``docs/x.md, "Section"``
    citations whose section is no heading or bold run-in of that page (a prefix of one,
    ignoring case and backticks)."""
    problems = []
    for path in cited_files(root):
        text = path.read_text()
        where = path.relative_to(root)
        for name in set(_MD_NAME.findall(text)):
            candidates = [root / name, root / "docs" / name, path.parent / name]
            if not any(c.resolve().is_relative_to(root) and c.is_file() for c in candidates):
                problems.append(f"{where}: names {name}, which is not in the repository")
        for name, section in _CITATION.findall(text):
            page = next((c for c in (root / name, path.parent / name) if c.is_file()), None)
            if page is None:
                continue  # reported above
            body = _FENCE.sub("", page.read_text())
            headings = [
                h.replace("`", "").lower() for h in _HEADING.findall(body) + _RUN_IN.findall(body)
            ]
            if not any(h.startswith(section.replace("`", "").lower()) for h in headings):
                problems.append(f"{where}: cites {name}, {section!r}, which is no heading there")
    return sorted(problems)


def test_every_document_the_code_and_the_pages_cite_exists() -> None:
    problems = citation_problems()
    assert problems == [], "\n".join(problems)


def test_the_citation_check_finds_a_missing_file_and_a_missing_section(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text("# Design\n\n## Merge engines (read-time)\n")
    (tmp_path / "README.md").write_text("# Readme\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "mod.py").write_text(
        '"""See DESIGN.md "Data path", docs/design.md, "Merge engines" and\n'
        'docs/design.md, "Commit protocol"."""\n'
    )

    assert citation_problems(tmp_path) == [
        "src/mod.py: cites docs/design.md, 'Commit protocol', which is no heading there",
        "src/mod.py: names DESIGN.md, which is not in the repository",
    ]
