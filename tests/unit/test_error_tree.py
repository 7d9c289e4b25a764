"""One error tree: every error Millstream raises on purpose is a class of ``millstream.errors``
with a docstring for the operator, a REST status and a CLI exit code, and the exit codes the
CLI help and docs/cli.md list are exactly the table's. Errors once lived in five modules and
in neither table, so a lost lease answered HTTP 500 and exited 1 like a crash."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import millstream
from millstream.cli.control import SERVICE_EXIT_HELP
from millstream.cli.datastream import EXIT_CODES_HELP
from millstream.cli.output import exit_codes_help
from millstream.errors import (
    EXIT_CODES,
    EXIT_FAMILIES,
    HTTP_EXIT_CODES,
    HTTP_STATUS,
    MillstreamError,
)

PACKAGE = Path(millstream.__file__).parent
CLI_DOC = Path(__file__).parents[2] / "docs" / "cli.md"
NOT_ERRORS = {0, 130}  # ok, interrupted


def _import_every_module() -> None:
    for module in pkgutil.walk_packages(millstream.__path__, "millstream."):
        importlib.import_module(module.name)


def _tree(cls: type[MillstreamError]) -> list[type[MillstreamError]]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_tree(sub)]
    return found


def _entry(table: dict[type[MillstreamError], int], cls: type[MillstreamError]) -> int | None:
    """The entry of ``cls`` or of its nearest ancestor below the root, if any."""
    for c in cls.__mro__:
        if c is MillstreamError:
            return None
        if c in table:
            return table[c]
    return None


def test_every_error_lives_in_the_error_module_with_a_status_and_an_exit_code() -> None:
    _import_every_module()
    ours = [c for c in _tree(MillstreamError) if c.__module__.startswith("millstream.")]

    assert len(ours) > 20
    elsewhere = [
        f"{c.__module__}.{c.__qualname__}" for c in ours if c.__module__ != "millstream.errors"
    ]
    assert elsewhere == [], "define every error in millstream.errors"
    assert [c.__name__ for c in ours if _entry(HTTP_STATUS, c) is None] == []
    assert [c.__name__ for c in ours if _entry(EXIT_CODES, c) is None] == []
    undocumented = [c.__name__ for c in ours if not (vars(c).get("__doc__") or "").strip()]
    assert undocumented == [], "each error's docstring says what the operator can do"


def test_every_exit_code_is_named_and_every_named_error_code_is_used() -> None:
    error_codes = set(EXIT_CODES.values())

    assert error_codes <= set(EXIT_FAMILIES)
    assert set(EXIT_FAMILIES) - error_codes == NOT_ERRORS
    assert set(HTTP_EXIT_CODES.values()) <= error_codes
    assert all(400 <= status < 600 for status in HTTP_STATUS.values())


# -- no bare MillstreamError ---------------------------------------------------------------


def bare_raises(source: str) -> list[str]:
    """Where ``source`` raises the root class itself (``raise MillstreamError(...)``,
    ``raise errors.MillstreamError``): such an error is in neither table."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Raise) or node.exc is None:
            continue
        target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        name = (
            target.id
            if isinstance(target, ast.Name)
            else target.attr
            if isinstance(target, ast.Attribute)
            else ""
        )
        if name == "MillstreamError":
            found.append(f"line {node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_the_check_finds_every_form_of_a_bare_raise() -> None:
    for snippet in (
        "raise MillstreamError('x')",
        "raise errors.MillstreamError('x', table='t')",
        "raise MillstreamError",
        "def f():\n    raise MillstreamError(f'x {y}') from None",
    ):
        assert bare_raises(snippet), snippet
    for snippet in (
        "raise ShardGapError('t', {})",
        "try:\n    x()\nexcept MillstreamError:\n    raise",
        "raise SparkQueryError(MillstreamError, 'x')",
    ):
        assert not bare_raises(snippet), snippet


def test_no_code_raises_the_root_error_itself() -> None:
    found = {
        str(path.relative_to(PACKAGE)): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if (hits := bare_raises(path.read_text()))
    }
    assert found == {}, "raise a class of millstream.errors (add one if none fits)"


# -- the exit codes the CLI help and docs/cli.md list ---------------------------------------


def listed_exit_codes(text: str) -> dict[int, str]:
    """The codes of an ``Exit codes: 0 ok; 1 ...; 130 interrupted.`` list, with their prose."""
    body = text.split("Exit codes:", 1)[1].strip().rstrip(".")
    listed = {}
    for entry in re.split(r";\s+(?=\d+ )", body):
        m = re.fullmatch(r"\s*(\d+) (.+)", entry, re.DOTALL)
        assert m is not None, f"not '<code> <meaning>': {entry!r}"
        listed[int(m.group(1))] = " ".join(m.group(2).split())
    return listed


def exit_code_list_problems(text: str) -> list[str]:
    """How an exit-code list differs from :data:`EXIT_FAMILIES`: a code missing or extra, or a
    meaning that does not contain the family's name."""
    listed = listed_exit_codes(text)
    problems = [
        f"{code} ({EXIT_FAMILIES[code]}) is missing"
        for code in EXIT_FAMILIES.keys() - listed.keys()
    ]
    problems += [f"{code} is not an exit code" for code in listed.keys() - EXIT_FAMILIES.keys()]
    problems += [
        f"{code} should say {EXIT_FAMILIES[code]!r}, says {meaning!r}"
        for code, meaning in listed.items()
        if code in EXIT_FAMILIES and EXIT_FAMILIES[code].lower() not in meaning.lower()
    ]
    return sorted(problems)


def cli_doc_exit_codes_paragraph() -> str:
    paragraphs = re.split(r"\n\s*\n", CLI_DOC.read_text())
    found = [p for p in paragraphs if p.startswith("Exit codes:")]
    assert len(found) == 1, "docs/cli.md has one paragraph starting 'Exit codes:'"
    return found[0]


def test_the_check_finds_a_missing_code_an_extra_code_and_a_wrong_meaning() -> None:
    good = exit_codes_help()
    missing = good.replace("; 7 segment unavailable", "")
    extra = good.replace("130 interrupted", "130 interrupted; 13 tired")
    wrong = good.replace("3 not found", "3 already exists")

    assert exit_code_list_problems(good) == []
    assert exit_code_list_problems(missing) == ["7 (segment unavailable) is missing"]
    assert exit_code_list_problems(extra) == ["13 is not an exit code"]
    assert exit_code_list_problems(wrong) == ["3 should say 'not found', says 'already exists'"]


def test_the_cli_doc_lists_exactly_the_exit_codes_of_the_table() -> None:
    assert exit_code_list_problems(cli_doc_exit_codes_paragraph()) == []


def test_the_cli_help_lists_exactly_the_exit_codes_of_the_table() -> None:
    assert exit_code_list_problems(exit_codes_help()) == []
    assert exit_code_list_problems(EXIT_CODES_HELP.split(". A refused call")[0]) == []
    for status, code in HTTP_EXIT_CODES.items():
        assert f"{status} exits {code}" in EXIT_CODES_HELP


def test_the_service_exit_codes_are_codes_of_the_table() -> None:
    listed = listed_exit_codes(SERVICE_EXIT_HELP)

    assert set(listed) == {0, 1, 2}
    assert set(listed) <= set(EXIT_FAMILIES)
    assert "service failed" in listed[1] and "service failure" in EXIT_FAMILIES[1]
