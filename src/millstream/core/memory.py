"""Giving back to the system what a process freed but its allocators keep.

A long-lived process that frees a large working set (a publish round, a catch-up's write task)
keeps the freed pages in Arrow's memory pool (mimalloc by default) and in glibc's arenas for
later; :func:`release_freed_memory` returns them. The publisher calls it after a round that
published (:mod:`millstream.sealing.maintenance`), a Spark task worker after a task that grew it
(:func:`millstream.spark.sources.release_after_task`)."""

from __future__ import annotations

import ctypes
from typing import Any

import pyarrow as pa


def _malloc_trim() -> Any:
    """glibc's ``malloc_trim`` (None where the C library has none: musl, macOS). Looked up
    among the symbols the process has loaded (the C library's among them), not by
    ``ctypes.util.find_library``, which runs ``ldconfig -p`` in a subprocess (~4 ms) in every
    process that imports this module: each of Spark's Python task workers."""
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)
    except OSError:
        return None


_MALLOC_TRIM = _malloc_trim()


def release_freed_memory() -> None:
    """The Arrow pool's ``release_unused()``, then glibc's ``malloc_trim(0)`` where there is
    one."""
    pa.default_memory_pool().release_unused()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
