"""The one SparkSession a Millstream process uses, configured for streaming ingestion."""

from __future__ import annotations

import os
import sys
from typing import Any

DEFAULT_MASTER = "local[2]"


def spark_session(
    *, master: str | None = None, app_name: str = "millstream", log_level: str = "ERROR"
) -> Any:
    """Create (or get) the SparkSession. Master: argument, else ``MILLSTREAM_SPARK_MASTER``,
    else ``local[2]``. Workers run this interpreter (``PYSPARK_PYTHON``)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(
            master or os.environ.get("MILLSTREAM_SPARK_MASTER") or DEFAULT_MASTER
        )
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark
