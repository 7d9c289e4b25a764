"""What a spec with mistakes says: every bad field at once, the field one probably meant, the
source kinds there are."""

from __future__ import annotations

import pytest

from millstream.datastream import DatastreamSpec
from millstream.errors import InvalidSpecError
from millstream.spec import TableSpec

BASE = {
    "name": "orders",
    "source": {"kind": "kafka", "topic": "orders", "bootstrap_servers": "127.0.0.1:9092"},
    "schema": {"id": "long", "status": "string"},
}


def _error(spec: dict[str, object]) -> InvalidSpecError:
    with pytest.raises(InvalidSpecError) as info:
        DatastreamSpec.parse(spec)
    return info.value


def test_a_misspelt_field_names_the_field_meant() -> None:
    err = _error({**BASE, "table": {"primary_keys": ["id"], "mode": "upsert"}})
    assert err.field == "table.primary_keys"
    assert err.message == (
        "invalid table.primary_keys: is not a field of the spec; did you mean `primary_key`?"
    )
    with pytest.raises(InvalidSpecError, match="did you mean `primary_key`"):
        TableSpec.parse({"name": "t", "schema": {"id": "long"}, "primary_keys": ["id"]})
    far = _error({**BASE, "source": {**BASE["source"], "zzz": 1}})  # type: ignore[dict-item]
    assert "is not a field of the spec (the fields here: " in far.message
    assert "bootstrap_servers, topic, " in far.message


def test_every_bad_field_and_type_is_reported_at_once() -> None:
    err = _error(
        {
            **BASE,
            "schema": {"id": "lng", "status": "strng", "qty": "long"},
            "table": {"mode": "upsrt"},
        }
    )
    for said in (
        "invalid schema.id: 'lng' is not a type",
        "invalid schema.status: 'strng' is not a type",
    ):
        assert said in err.message
    err = _error({**BASE, "table": {"mode": "upsrt", "primary_keys": ["id"]}, "replicas": 0})
    for said in ("invalid table.mode: 'upsrt'", "invalid table.primary_keys", "invalid replicas"):
        assert said in err.message


def test_an_unknown_source_kind_is_a_sentence_listing_the_kinds() -> None:
    err = _error({**BASE, "source": {"kind": "kafak", "topic": "orders"}})
    assert err.field == "source.kind"
    assert err.message == (
        "invalid source.kind: 'kafak' is not a source kind; the kinds are kafka, files, "
        "generator (did you mean 'kafka'?)"
    )
    missing = _error({**BASE, "source": {"topic": "orders"}})
    assert missing.message == (
        "invalid source.kind: is missing; a source is one of the kinds kafka, files, generator"
    )
