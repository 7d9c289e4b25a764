"""How long a staged file may wait for its commit, and how long garbage collection waits before
deleting an unreferenced file: constants of :mod:`millstream.table.gc` and
:mod:`millstream.table.commit`, in a module of their own because the Python process Spark
starts for every streaming query's source imports :mod:`millstream.spark.options`, and
``millstream.table.gc`` would bring the metadata store and SQLAlchemy with it (~0.45 s of
every query's start, and the memory of every datastream's source process)."""

from __future__ import annotations

DEFAULT_GRACE_SECONDS = 3600.0
#: A commit refuses staged files older than this (``millstream.table.commit``), so garbage
#: collection with a grace period above it never deletes a file a commit is about to reference.
MAX_STAGED_AGE_SECONDS = DEFAULT_GRACE_SECONDS / 2
#: A publish of a table's Iceberg view refuses to move the pointer to a snapshot whose first
#: file it began writing longer ago than this (``millstream.table.iceberg.publish``): until the
#: pointer names them, a snapshot's files are unreferenced, and the view's garbage collection
#: deletes unreferenced files older than its grace period. Half the smallest grace table
#: maintenance accepts (``MAX_STAGED_AGE_SECONDS``, ``table maintain --grace``), so the check
#: right before the pointer's COMMIT leaves the COMMIT itself a margin as long again.
MAX_PUBLISH_AGE_SECONDS = MAX_STAGED_AGE_SECONDS / 2
