"""The mutation list cannot rot unnoticed: every guard's text is in its file exactly once, and
every test it names exists. ``tests/mutations.py`` reports a guard whose text does not apply as
NOT APPLIED, but it runs by hand; two guards (rows 10 and 13 of docs/design.md's table) did
not apply for five sessions after compaction copied the seal's file-keeping line, and nothing
said so."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def _mutations() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "millstream_mutations", REPO / "tests" / "mutations.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


def test_every_guard_applies_exactly_once_and_names_tests_that_exist() -> None:
    guards = _mutations().GUARDS
    assert guards
    problems: list[str] = []
    for g in guards:
        count = (REPO / g.file).read_text().count(g.old)
        if count != 1:
            problems.append(f"{g.name}: its text occurs {count} times in {g.file}")
        for test in g.tests:
            path, _, name = test.partition("::")
            if not (REPO / path).exists():
                problems.append(f"{g.name}: no test file {path}")
            elif name and f"def {name.split('[')[0]}(" not in (REPO / path).read_text():
                problems.append(f"{g.name}: no test {name} in {path}")
    assert not problems, "\n".join(problems)
