"""The merged copy of a sealed table: a read's answer, stored beside the table.

A ``millstream run --available-now`` seals everything it wrote before it exits, and then no
writer touches the table until the next run. A read of it still merges every partition's
sealed rows: when the source's partitions are not keyed (files in directories, a topic
produced round-robin), a key has a row in up to every partition, and 1M upserts of 200k keys
over 4 partitions leave 563k sealed rows for 195k live ones. Delete vectors cannot take those
rows out (a key's winner is decided across partitions, and a rollback of one partition must
bring another's rows back), and no read of them costs less than decoding them all.

So the run's final seal pass (:meth:`millstream.sealing.sealer.Sealer.seal_what_is_due` with
``everything``) writes the read's answer once, as one Parquet file named by a digest of
everything that answer is computed from (:func:`copy_path`): the table's definition (less its
retention, which changes no row) and the manifest's entries (file, partition, offset range)
and delete vectors (file, partition). Every data file is written once under a unique name and
never changed, so the same entries and vectors are the same rows: the copy is exact for every
manifest with that digest, and for no other. A commit, a seal, a compaction, a rollback, a
re-ingestion or a schema change gives the manifest another digest, and the read merges as
before until the next run writes the copy of the new one.

A reader (:func:`millstream.table.read.read_manifest`) looks for the copy only when every
entry is sealed and it wants what the copy holds (the whole table, without system columns,
with delete vectors applied); a copy that is missing, unreadable or of other columns is
skipped and the read merges. Each new copy deletes the table's older ones (a reader of an
older version then merges; it never reads a copy that is not its manifest's).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass

import pyarrow as pa

from millstream.metastore.models import Manifest, SegmentState
from millstream.storage.deepstore import DeepStore, dictionary_columns
from millstream.table.cache import ReadCache

log = logging.getLogger(__name__)

#: The largest table (its entries' rows, before the merge) a final seal pass stores a copy of:
#: the pass merges the table in the run's driver, as a read would, and a run must not hold
#: more than a catch-up's batch does for a copy nobody asked for.
MAX_ROWS = 4_000_000


@dataclass(frozen=True, slots=True)
class MergedCopy:
    """A written copy: its path in the deep store, its rows and bytes."""

    path: str
    rows: int
    size_bytes: int


def merged_prefix(table: str) -> str:
    """Where ``table``'s merged copies live (outside its data files, which GC collects)."""
    return f"tables/{table}/merged"


def copy_path(manifest: Manifest) -> str | None:
    """The path of the merged copy of ``manifest``'s read: a digest of what the read is
    computed from. None for a table without a key (its read is a concatenation already), an
    empty manifest, or one with an entry not sealed (a writer is at work: a copy would be
    stale by its next commit)."""
    spec = manifest.table.spec
    entries = manifest.entries
    if not spec.keyed or not entries or any(e.state is not SegmentState.ONLINE for e in entries):
        return None
    what = {
        "table": spec.model_dump(mode="json", by_alias=True, exclude={"retention"}),
        "columns": [[f.name, str(f.type)] for f in spec.arrow_schema()],  # in their order
        "created_at": manifest.table.created_at,
        "entries": sorted([e.file_path or "", e.partition, e.start, e.end] for e in entries),
        "vectors": sorted([dv.file_path, dv.partition] for dv in manifest.delete_vectors),
    }
    digest = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()
    return f"{merged_prefix(spec.name)}/{digest}.parquet"


def read_copy(
    deep: DeepStore, manifest: Manifest, cache: ReadCache | None = None
) -> pa.Table | None:
    """The merged copy of ``manifest``'s read, or None if there is none to use (see the
    module's docstring); kept in ``cache``, if given, under its path (a copy is never
    rewritten)."""
    path = copy_path(manifest)
    if path is None:
        return None
    if cache is not None:
        found = cache.lookup(("merged-copy", path))
        if found is not None:
            return found
    if not deep.exists(path):
        return None
    schema = manifest.table.spec.arrow_schema()
    try:
        rows = deep.read_parquet(path)
        if rows.schema.names != schema.names:
            raise pa.ArrowInvalid(f"columns {rows.schema.names}, not the table's {schema.names}")
        rows = rows.cast(schema)
    except (OSError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        # deleted by a newer copy meanwhile, a write cut short: merge
        log.warning(
            "merged copy %s of table %s is unreadable, merging instead: %s",
            path,
            manifest.table.name,
            str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
        )
        return None
    if cache is not None:
        cache.put(("merged-copy", path), rows)
    return rows


def write_copy(deep: DeepStore, manifest: Manifest, rows: pa.Table) -> MergedCopy | None:
    """Store ``rows``, which must be ``manifest``'s read (whole, without system columns,
    with its delete vectors), as its merged copy, and delete the table's other copies. None
    (nothing written) if the manifest has no copy (:func:`copy_path`)."""
    path = copy_path(manifest)
    if path is None:
        return None
    size = deep.write_parquet(path, rows, dictionary=dictionary_columns(rows))
    for old in deep.list_files(merged_prefix(manifest.table.name)):
        if old.path != path:
            deep.delete(old.path)
    return MergedCopy(path, rows.num_rows, size)
