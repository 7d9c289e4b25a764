"""docs/spec-reference.md is generated from the spec models and kept current: the committed file
is exactly what ``python -m millstream.cli.spec_reference`` writes today, a field added to a
model without regenerating makes ``--check`` fail, and a field without a description cannot be
rendered at all."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field, create_model

from millstream.cli import spec_reference
from millstream.datastream import DatastreamSpec, SegmentsSection

DOC = Path(__file__).resolve().parents[2] / spec_reference.DOC_PATH


def test_the_committed_reference_is_what_the_models_say() -> None:
    assert spec_reference.main(["--check", "--path", str(DOC)]) == 0, (
        "docs/spec-reference.md is stale: run python -m millstream.cli.spec_reference"
    )


def test_every_field_of_every_section_is_in_the_reference() -> None:
    text = DOC.read_text()
    for name in DatastreamSpec.model_fields:
        field = DatastreamSpec.model_fields[name]
        assert f"| `{field.alias or name}` |" in text
    for name in SegmentsSection.model_fields:
        assert f"| `segments.{name}` |" in text
    assert "| `source.bootstrap_servers` |" in text
    assert "| `table.retention.min_versions` |" in text


def test_a_field_added_without_regenerating_fails_the_check(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    grown = create_model(
        "DatastreamSpec",
        __base__=DatastreamSpec,
        watermark_lag=(str, Field(default="5s", description="How late a record may be.")),
    )
    monkeypatch.setattr(spec_reference, "DatastreamSpec", grown)

    assert "| `watermark_lag` | string | `5s` | How late a record may be. |" in (
        spec_reference.render()
    )
    assert spec_reference.main(["--check", "--path", str(DOC)]) == 1
    assert "docs/spec-reference.md is out of date" in capsys.readouterr().err


def test_a_field_without_a_description_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    grown = create_model("DatastreamSpec", __base__=DatastreamSpec, watermark_lag=(str, "5s"))
    monkeypatch.setattr(spec_reference, "DatastreamSpec", grown)

    with pytest.raises(ValueError, match=r"DatastreamSpec\.watermark_lag has no description"):
        spec_reference.render()


def test_writing_then_checking_round_trips(tmp_path: Path) -> None:
    target = tmp_path / "spec-reference.md"
    assert spec_reference.main(["--check", "--path", str(target)]) == 1  # missing: stale
    assert spec_reference.main(["--path", str(target)]) == 0
    assert target.read_text() == DOC.read_text()
    assert spec_reference.main(["--check", "--path", str(target)]) == 0
