"""Settings: where Millstream keeps its metadata and data. Loaded once at the edge."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_HOME = ".millstream"


class Settings(BaseModel):
    """Frozen, validated settings. Core code receives these; it never reads the environment."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    home: Path = Field(description="Millstream home: SQLite metadata and local deep store.")
    metadata_url: str = Field(description="SQLAlchemy URL of the metadata store.")
    deep_store: str = Field(description="Deep store root: a directory or s3://bucket/prefix.")
    s3_endpoint: str | None = Field(default=None, description="S3 endpoint override.")

    @classmethod
    def load(
        cls,
        *,
        home: str | Path | None = None,
        metadata_url: str | None = None,
        deep_store: str | None = None,
        s3_endpoint: str | None = None,
    ) -> Settings:
        """Arguments win over ``MILLSTREAM_HOME``, ``MILLSTREAM_METADATA_URL``,
        ``MILLSTREAM_DEEP_STORE`` and ``MILLSTREAM_S3_ENDPOINT``, which win over defaults."""
        h = Path(home or os.environ.get("MILLSTREAM_HOME") or DEFAULT_HOME).resolve()
        url = (
            metadata_url
            or os.environ.get("MILLSTREAM_METADATA_URL")
            or f"sqlite:///{h / 'metadata.db'}"
        )
        ds = deep_store or os.environ.get("MILLSTREAM_DEEP_STORE") or str(h / "deepstore")
        ep = s3_endpoint or os.environ.get("MILLSTREAM_S3_ENDPOINT")
        return cls(home=h, metadata_url=url, deep_store=ds, s3_endpoint=ep)

    def as_options(self) -> dict[str, str]:
        """The settings as string options, to hand to Spark tasks on other processes/hosts."""
        opts = {
            "home": str(self.home),
            "metadataUrl": self.metadata_url,
            "deepStore": self.deep_store,
        }
        if self.s3_endpoint:
            opts["s3Endpoint"] = self.s3_endpoint
        return opts

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> Settings:
        """From data source options (pass :class:`millstream.spark.options.Options`: Spark lower-cases keys)."""
        return cls.load(
            home=options.get("home"),
            metadata_url=options.get("metadataUrl"),
            deep_store=options.get("deepStore"),
            s3_endpoint=options.get("s3Endpoint"),
        )
