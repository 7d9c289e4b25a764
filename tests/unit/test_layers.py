"""The layering (docs/design.md, "Layers") is enforced, and nothing dodges it with a lazy import.

* The import-linter contract in pyproject.toml holds for the code as it is, and breaks when an
  upward import is added (a copy of the package with one probe module proves the contract is
  live, not vacuous).
* Every SQL statement and every use of the metadata schema is in ``millstream.metastore``: the
  contract forbidding ``sqlalchemy`` and ``millstream.metastore.schema`` elsewhere holds, and
  breaks when such an import is added (the same probe trick).
* Inside ``millstream.metastore`` only the facade (``store``) takes the facade: its modules take
  a connection and a clock, and a module importing ``store`` breaks the contract that puts
  ``store`` above them (the same probe trick).
* No ``import`` runs inside a function body in ``src/`` except in the modules that keep start-up
  fast (the CLI, the package ``__init__``, the stream source that Spark starts per query), and
  there each block of such imports carries a ``# lazy:`` comment saying why.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "millstream"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

#: Modules where function-level imports are allowed (each block with a ``# lazy:`` comment).
LAZY_IMPORT_MODULES = {
    "__init__.py": "PEP 562 lazy attributes: Spark starts a Python process per query",
    "cli/*": "the CLI imports Spark, SQLAlchemy and FastAPI only for the commands that use them",
    "spark/sources.py": "the query's source process loads SQLAlchemy only for a gated standby",
    "spark/sink.py": "the sealer (and pandas) load only where the sink seals inline, the "
    "metadata store (SQLAlchemy) only in the driver, not in a write task's worker",
    "table/commit.py": "the metadata store's append (SQLAlchemy) loads only where a batch "
    "commits (the driver), not in a write task's worker that stages files",
    "ingest/formats/avro.py": "polars (0.3-1 s to import) loads only where Avro is decoded",
    "spark/options.py": "the query's source process loads pydantic (the spec) only if gated",
    "ingest/sources/files.py": "the decoders' libraries load where a spec is read, not in the "
    "query's source process",
    "ingest/sources/kafka.py": "as files.py",
    "table/maintain.py": "pyiceberg loads only where a table has an Iceberg view",
    "sealing/maintenance.py": "pyiceberg loads only in a process that publishes Iceberg views",
    "spark/runner.py": "pyiceberg loads only in an available-now run that publishes its views",
    "sealing/keyindex.py": "pandas (its key hash) loads in an available-now run's driver only "
    "at its final seal, not beside its write tasks",
    "metastore/evolve.py": "the datastream spec loads only where a schema changes, not in "
    "every process that opens the store (`millstream query`)",
    "metastore/schema.py": "the datastream spec loads only where a migration parses one, not "
    "in every process that opens the store (`millstream query`)",
}


def _lint_imports(config: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(config), "--no-cache", "--no-logo"],
        capture_output=True,
        text=True,
        env=env,
        cwd=config.parent,
        timeout=120,
    )


def test_the_layering_contract_holds() -> None:
    result = _lint_imports(REPO / "pyproject.toml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Millstream layers KEPT" in result.stdout
    assert "SQL and the metadata schema only inside millstream.metastore KEPT" in result.stdout
    assert "No import cycle among the modules of millstream.metastore KEPT" in result.stdout
    assert FACADE_ON_TOP + " KEPT" in result.stdout


def test_an_upward_import_breaks_the_contract(tmp_path: Path) -> None:
    """The storage layer may not reach up into the control plane: added on purpose, it fails."""
    shutil.copytree(SRC, tmp_path / "src" / "millstream")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    probe = tmp_path / "src" / "millstream" / "storage" / "probe.py"
    probe.write_text("from millstream.control import worker\n")
    result = _lint_imports(tmp_path / "pyproject.toml", pythonpath=tmp_path / "src")
    assert result.returncode != 0, result.stdout
    assert "millstream.storage is not allowed to import millstream.control" in result.stdout
    assert "millstream.storage.probe -> millstream.control.worker" in result.stdout


def test_sql_or_the_schema_outside_the_metastore_breaks_the_contract(tmp_path: Path) -> None:
    """The control plane may not run SQL on the schema, nor the API reach for SQLAlchemy: two
    probes added on purpose, each named by the broken contract."""
    shutil.copytree(SRC, tmp_path / "src" / "millstream")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "src" / "millstream" / "control" / "probe.py").write_text(
        "from millstream.metastore import schema\n"
    )
    (tmp_path / "src" / "millstream" / "api" / "probe.py").write_text(
        "from sqlalchemy import select\n"
    )
    result = _lint_imports(tmp_path / "pyproject.toml", pythonpath=tmp_path / "src")
    assert result.returncode != 0, result.stdout
    assert "Millstream layers KEPT" in result.stdout  # both probes import downwards
    assert "SQL and the metadata schema only inside millstream.metastore BROKEN" in result.stdout
    assert "millstream.control.probe -> millstream.metastore.schema" in result.stdout
    assert "millstream.api.probe -> sqlalchemy" in result.stdout


FACADE_ON_TOP = "Only the facade (millstream.metastore.store) is above the metastore's modules"


def test_a_metastore_module_importing_the_facade_breaks_the_contract(tmp_path: Path) -> None:
    """A metastore module that takes the facade again, even for a type only, is refused."""
    shutil.copytree(SRC, tmp_path / "src" / "millstream")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    pins = tmp_path / "src" / "millstream" / "metastore" / "pins.py"
    pins.write_text(
        pins.read_text()
        + "\n\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
        + "    from millstream.metastore.store import MetadataStore\n"
    )
    result = _lint_imports(tmp_path / "pyproject.toml", pythonpath=tmp_path / "src")
    assert result.returncode != 0, result.stdout
    assert FACADE_ON_TOP + " BROKEN" in result.stdout
    assert "millstream.metastore.pins is not allowed to import millstream.metastore.store" in (
        " ".join(result.stdout.split())
    )


def _allowed(rel: str) -> bool:
    return any(
        rel == pattern or (pattern.endswith("/*") and rel.startswith(pattern[:-1]))
        for pattern in LAZY_IMPORT_MODULES
    )


def _function_level_imports(path: Path) -> list[tuple[int, bool]]:
    """(line, has a ``# lazy:`` comment) of every import inside a function body: a comment
    counts for a block of consecutive imports when it sits on a line just above the block."""
    lines = path.read_text().splitlines()
    tree = ast.parse("\n".join(lines))
    found: list[tuple[int, bool]] = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            line = node.lineno
            # Walk up over the block's earlier imports and comments to the block's comment.
            i = line - 2
            commented = False
            while i >= 0:
                text = lines[i].strip()
                if not text:  # a blank line between import groups (isort) ends no block
                    i -= 1
                    continue
                if text.startswith("#"):
                    if "lazy:" in text:
                        commented = True
                        break
                elif not (
                    text.startswith(("import ", "from "))
                    or text.startswith(")")
                    or text.endswith(",")
                    or text.endswith("(")
                ):
                    break
                i -= 1
            found.append((line, commented))
    return found


def test_no_import_inside_a_function_except_the_documented_lazy_ones() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for line, commented in _function_level_imports(path):
            if not _allowed(rel):
                offenders.append(f"src/millstream/{rel}:{line}: import inside a function")
            elif not commented:
                offenders.append(
                    f"src/millstream/{rel}:{line}: lazy import without a '# lazy: why' comment"
                )
    assert not offenders, "\n".join(offenders)


def test_a_streaming_querys_source_process_does_not_load_the_metadata_store() -> None:
    """Spark starts a fresh Python process for every streaming query's source, and it imports
    ``millstream.spark.sources``. The metadata store (SQLAlchemy, ~0.45 s and tens of MB) is
    not needed there: ``spark.options`` once reached it through ``table.gc`` for a constant,
    which every query's start and every datastream's memory paid for. Nor are the spec
    (pydantic, YAML) and the record decoders (fastavro, protobuf): the source plans offsets,
    the sink decodes; they cost a query start about 0.4 s."""
    code = (
        "import sys, millstream.spark.sources; "
        "print(sorted(m for m in ('sqlalchemy', 'millstream.metastore.store', 'pandas', "
        "'fastapi', 'pydantic', 'yaml', 'fastavro', 'google.protobuf', 'millstream.spec', "
        "'millstream.ingest.decode') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout
