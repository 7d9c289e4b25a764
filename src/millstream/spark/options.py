"""Spark hands data sources their options with lower-cased keys; look them up either way."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class Options(dict[str, str]):
    def __init__(self, raw: Mapping[Any, Any] | None = None) -> None:
        super().__init__({str(k).lower(): str(v) for k, v in dict(raw or {}).items()})

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and super().__contains__(key.lower())
