"""The one registry of Millstream sources: ``kind`` -> :class:`PartitionReader` class.

A datastream's ``source`` section names its kind; :func:`config_for` turns the section into
the reader's config and :func:`reader_for` builds a reader from a kind and a config. The Spark
adapters (:mod:`millstream.spark.sources`) register one Spark data source per kind from this
table, so a new source is one class here and nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from millstream.errors import InvalidSpecError
from millstream.ingest.sources.base import PartitionReader
from millstream.ingest.sources.files import FilesReader
from millstream.ingest.sources.generator import GeneratorReader
from millstream.ingest.sources.kafka import KafkaReader

__all__ = ["SOURCES", "PartitionReader", "config_for", "reader_class", "reader_for", "spec_reader"]

SOURCES: dict[str, type[PartitionReader]] = {
    cls.kind: cls for cls in (KafkaReader, FilesReader, GeneratorReader)
}


def reader_class(kind: str) -> type[PartitionReader]:
    try:
        return SOURCES[kind]
    except KeyError:
        raise InvalidSpecError(
            "source.kind", f"unknown source kind {kind!r}; known: {', '.join(sorted(SOURCES))}"
        ) from None


def config_for(source: Any, datastream: str | None = None) -> tuple[str, dict[str, Any]]:
    """The kind and config fields (JSON-able) of a datastream's ``source`` section (a
    :data:`millstream.datastream.SourceSpec` model); ``datastream`` names the datastream in
    the reader's errors (a source kind that names it)."""
    cls = reader_class(source.kind)
    fields = source.model_dump()
    if datastream is not None:
        fields["datastream"] = datastream
    config = cls.config_from_spec(fields)
    return source.kind, dataclasses.asdict(config)


def reader_for(
    kind: str, config: Mapping[str, Any], *, start_offsets: Mapping[int, int] | None = None
) -> PartitionReader:
    """A reader of source ``kind`` with ``config`` (the fields of its config class)."""
    cls = reader_class(kind)
    return cls(cls.Config(**config), start_offsets=dict(start_offsets or {}))


def spec_reader(source: Any) -> PartitionReader:
    """A reader of a datastream's ``source`` section (for lag, bootstrap and re-ingestion)."""
    return reader_for(*config_for(source))
