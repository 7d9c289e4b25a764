"""What a table's ``mode`` means lives in one place: :mod:`millstream.core.engines`.

Every other module asks the table's engine (``engine_for(spec)``) how rows resolve, what a seal
may drop, what the key index keeps and whether a sealed partition is final. This scans the
package's source and fails on any comparison, ``match`` or lookup on a ``.mode`` attribute
outside the engines' home, so a rule re-derived elsewhere (``spec.mode == "upsert" and
spec.comparison_column is None``, say) is caught by ``make lint`` and ``make test``.

Allowed besides the engines: :mod:`millstream.spec`, which declares the modes and validates
which options each accepts (it sits below ``core`` in the layers contract, so it cannot ask an
engine), and ``millstream/reference/``, the reference semantics: its sequential model restates
every engine's rule on purpose, one row at a time, as the independent oracle the engines are
checked against.
"""

from __future__ import annotations

import ast
from pathlib import Path

import millstream

PACKAGE = Path(millstream.__file__).resolve().parent
#: Paths (relative to the package) where ``.mode`` may be compared; a directory ends in "/".
ALLOWED = ("core/engines/", "spec.py", "reference/")


def _is_mode(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "mode"


def mode_checks(source: str) -> list[int]:
    """Line numbers of the checks on a ``.mode`` attribute in ``source``: a comparison
    (``==``, ``!=``, ``in``, ``is`` ...), a ``match`` on it, or a lookup keyed by it."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            checked = [node.left, *node.comparators]
        elif isinstance(node, ast.Match):
            checked = [node.subject]
        elif isinstance(node, ast.Subscript):
            checked = [node.slice]
        else:
            continue
        if any(_is_mode(n) for n in checked):
            lines.append(node.lineno)
    return sorted(lines)


def _allowed(relative: str) -> bool:
    return any(relative.startswith(a) if a.endswith("/") else relative == a for a in ALLOWED)


def test_no_mode_check_outside_the_engines_home() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if _allowed(relative):
            continue
        found += [f"src/millstream/{relative}:{line}" for line in mode_checks(path.read_text())]
    assert not found, (
        "table.mode is checked outside millstream.core.engines; ask the table's engine "
        "(engine_for(spec)) instead, or give the engine the rule:\n  " + "\n  ".join(found)
    )


def test_the_scan_finds_every_form_of_a_mode_check() -> None:
    """The scan above cannot pass by finding nothing: each form of a check is caught."""
    source = (
        "if spec.mode == 'upsert':\n"  # 1
        "    pass\n"
        "keyed = table.spec.mode != 'append'\n"  # 3
        "fast = spec.mode in ('dedup', 'partial')\n"  # 4
        "match spec.mode:\n"  # 5
        "    case 'upsert':\n"
        "        pass\n"
        "agg = {'upsert': 'max'}[spec.mode]\n"  # 8
        "label = f'{spec.mode}'\n"  # naming the mode in a message is no check
        "replica = spec.replica_mode == 'standby'\n"  # another attribute
    )
    assert mode_checks(source) == [1, 3, 4, 5, 8]


def test_the_engines_home_and_the_spec_are_where_the_modes_are_checked() -> None:
    """The allow-list names files that exist (a moved engine must not leave the scan blind)."""
    for allowed in ALLOWED:
        assert (PACKAGE / allowed).exists(), allowed
    assert mode_checks((PACKAGE / "core" / "engines" / "__init__.py").read_text())
