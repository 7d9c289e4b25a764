"""pandas made unimportable in a process that has no use for it.

pyarrow imports pandas at its first conversion of a Python object (``pa.array()``,
``pa.scalar()``) only to ask whether the object is a DataFrame or a Series, and takes an
``ImportError`` as "no pandas"; PySpark's session start does the same to ask whether its
tests may use it. Where nothing else a process runs needs pandas, that import is ~35 MiB and
0.2-0.5 s of a short process for nothing."""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any


class NoPandas(importlib.abc.MetaPathFinder):
    """A finder (first in :data:`sys.meta_path`) that refuses pandas and its submodules."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def skip_pandas() -> NoPandas | None:
    """Make pandas unimportable in this process (and the processes it forks from now on);
    returns the finder, or None when pandas was imported already."""
    if "pandas" in sys.modules:
        return None
    finder = NoPandas()
    sys.meta_path.insert(0, finder)
    return finder
