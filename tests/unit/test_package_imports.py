"""A plain ``pip install .`` (no extras) imports every module of the package.

Test-only code (servers, the cluster runner, the fault campaigns) lives in ``tests/harness``,
not in ``src/``; this keeps it that way. A fresh interpreter imports every module that
``pkgutil.walk_packages`` finds under ``millstream`` while a ``sys.meta_path`` finder refuses
every top-level module that only the optional extras (``test``, ``demo``) bring: the
distributions they require, transitively, minus those the package's own dependencies require,
read from pyproject.toml and the installed distributions' metadata. That stands in for a
virtualenv without the extras (building one per run costs minutes) and fails the same way: on
the module that imports a test-only package, named with the import that failed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import millstream

REPO = Path(__file__).resolve().parents[2]
PACKAGE_DIR = Path(millstream.__file__).resolve().parent

#: Run in a fresh interpreter: argv[1] is a JSON list of the top-level modules to refuse.
CHILD = r"""
import importlib, importlib.abc, json, pkgutil, sys, traceback

BLOCKED = frozenset(json.loads(sys.argv[1]))

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (only an extra installs it)",
                                      name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
import millstream

failures, imported = {}, ["millstream"]
def onerror(name):
    failures[name] = traceback.format_exc(limit=-3)

for info in pkgutil.walk_packages(millstream.__path__, "millstream.", onerror=onerror):
    try:
        importlib.import_module(info.name)
        imported.append(info.name)
    except BaseException:
        failures[info.name] = traceback.format_exc(limit=-3)
print(json.dumps({"file": millstream.__file__, "imported": imported, "failures": failures}))
"""


def _closure(requirements: list[Requirement]) -> set[str]:
    """The installed distributions ``requirements`` bring, transitively (markers evaluated for
    this interpreter and the extras asked for)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    names: set[str] = set()
    stack = list(requirements)
    while stack:
        req = stack.pop()
        name = canonicalize_name(req.name)
        key = (name, frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # not for this platform or Python
        names.add(name)
        for line in dist.requires or []:
            sub = Requirement(line)
            extras = {"", *req.extras}
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
                stack.append(sub)
    return names


def _extras_only_modules() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    product = _closure([Requirement(r) for r in project["dependencies"]])
    extras = [Requirement(r) for reqs in project["optional-dependencies"].values() for r in reqs]
    only_extras = _closure(extras) - product
    return {
        top
        for top, dists in metadata.packages_distributions().items()
        if dists and all(canonicalize_name(d) in only_extras for d in dists)
    }


def test_every_module_of_the_package_imports_without_the_optional_extras(tmp_path: Path) -> None:
    blocked = _extras_only_modules()
    # the stand-in refuses what a plain install lacks (else this test could not fail)...
    assert {"pytest", "hypothesis", "moto", "selenium", "flask"} <= blocked, sorted(blocked)
    # ...and nothing the package itself needs
    assert not {"pyspark", "pyarrow", "sqlalchemy", "fastapi", "psycopg", "duckdb"} & blocked

    result = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(sorted(blocked))],
        cwd=tmp_path,  # not the repository: tests/ must not be importable
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(report["file"]).resolve().parent == PACKAGE_DIR
    failures = report["failures"]
    assert not failures, "modules that need an optional extra to import:\n" + "\n".join(
        f"{name}:\n{trace}" for name, trace in sorted(failures.items())
    )
    imported = set(report["imported"])
    assert {"millstream.cli.app", "millstream.reference.oracle", "millstream.api"} <= imported
    expected = {
        ".".join(p.relative_to(PACKAGE_DIR.parent).with_suffix("").parts).removesuffix(".__init__")
        for p in PACKAGE_DIR.rglob("*.py")
    }
    assert expected <= imported, sorted(expected - imported)
