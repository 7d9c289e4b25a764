"""Session-wide test servers and Spark. Each starts on first request and stops at session end.

Under pytest-xdist (``make test`` runs ``-n 2 --dist loadgroup``) every worker is its own
session: it starts its own servers on free ports under its own ``tmp_path_factory`` directory,
and its own SparkSession. :func:`pytest_collection_modifyitems` keeps the heavy, timing-sensitive
tests (:data:`HEAVY`) in one xdist group, so they run one after another on one worker while the
other worker runs the small tests. Without ``-n`` the marks change nothing.
"""

from __future__ import annotations

import fnmatch
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from harness.servers import MotoS3Server, PostgresServer
from millstream import faults
from millstream.local.tansu import TansuBroker
from millstream.spark.session import spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist workers start with COLUMNS=80 and LINES=24 in their environment, which a
    # serial run does not have: the CLI's rich console would fix its width at 80 on import, and
    # the CLI tests' COLUMNS=200 (CliRunner's env) would no longer reach it
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

settings.register_profile("ci", deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

TESTS = Path(__file__).parent


@pytest.fixture(autouse=True)
def _no_fault_handler_outlives_its_test() -> Iterator[None]:
    """Fault handlers a test installs (:mod:`millstream.faults`) end with it."""
    yield
    faults.uninstall_all()


#: Tests that start their own service processes and JVMs, or inject faults with timeouts: under
#: xdist they share the ``heavy`` group, so no two of them compete for the 2 cores at once.
HEAVY = (
    "e2e/*",
    "fault/*campaign*",
    "integration/test_crash_recovery.py",
    "integration/test_cli_query_spark.py",
    "integration/test_cli_run_stop.py",
    "integration/test_cli_run_iceberg.py",
    "integration/test_local_cluster.py",
    "integration/test_multi_table_debezium.py",
)
#: Modules whose tests share an expensive module-scoped fixture (a produced topic, a browser):
#: each such module stays on one worker, so the fixture is built once.
WHOLE_MODULE = ("integration/*", "unit/api/test_console_browser.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank: dict[str, int] = {}
    for item in items:
        if not item.path.is_relative_to(TESTS):
            continue
        rel = item.path.relative_to(TESTS).as_posix()
        if item.get_closest_marker("e2e") or any(fnmatch.fnmatch(rel, p) for p in HEAVY):
            item.add_marker(pytest.mark.xdist_group("heavy"))
            rank[item.nodeid] = 0
        elif any(fnmatch.fnmatch(rel, p) for p in WHOLE_MODULE):
            item.add_marker(pytest.mark.xdist_group(rel))
            rank[item.nodeid] = 1
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # xdist hands out work in collection order: the long groups first, so the heavy worker
        # starts at once and the small tests fill the other worker (a serial run keeps its order)
        items.sort(key=lambda item: rank.get(item.nodeid, 2))


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    with PostgresServer(tmp_path_factory.mktemp("postgres")) as server:
        yield server


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoS3Server]:
    with MotoS3Server(tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    with TansuBroker(tmp_path_factory.mktemp("tansu")) as broker:
        yield broker


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = spark_session(
        master=os.environ.get("MILLSTREAM_TEST_SPARK_MASTER", "local[2]"),
        app_name="millstream-tests",
        log_level="WARN",
        config={
            "spark.default.parallelism": "2",
            "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("spark-warehouse")),
        },
    )
    try:
        yield session
    finally:
        session.stop()
