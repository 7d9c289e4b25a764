"""Session-wide test servers and Spark. Each starts on first request and stops at session end."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from millstream.local.tansu import TansuBroker
from millstream.spark.session import spark_session
from millstream.testing.servers import MotoS3Server, PostgresServer

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

settings.register_profile("ci", deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


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
