"""``millstream table ...``: maintenance of a deployment's tables, straight on its metadata and
deep store (``--home`` or the ``MILLSTREAM_*`` environment), no service needed."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from millstream.cli.output import (
    HomeOpt,
    OutputFormat,
    OutputOpt,
    console,
    emit_json,
    handle_errors,
    open_catalog,
    table_text,
)
from millstream.errors import InvalidSpecError

#: millstream.table.gc.DEFAULT_GRACE_SECONDS and MAX_STAGED_AGE_SECONDS, not imported:
#: `millstream --help` stays fast (a test checks they agree).
DEFAULT_GRACE_SECONDS = 3600.0
MIN_GRACE_SECONDS = 1800.0

app = typer.Typer(
    name="table",
    help="List and describe tables; maintain them: expire old versions (retention), delete "
    "unreferenced files, merge sealed segments.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


def _summary(cat: Any, info: Any) -> dict[str, Any]:
    """What ``table list`` prints of one table. ``rows`` is the current row count: summed from
    the manifest for an append table, counted after the merge for a keyed one (an upsert's
    superseded and deleted rows are not rows)."""
    manifest = cat.manifest(info.name)
    spec = info.spec
    rows = cat.read_table(info.name).num_rows if spec.keyed else manifest.row_count
    return {
        "table": info.name,
        "mode": spec.mode,
        "partitions": len(cat.store.list_shards(info.name)),
        "rows": rows,
        "version": manifest.version,
    }


@app.command("list", short_help="Every table: mode, partitions, rows, newest version.")
def list_tables(home: HomeOpt = None, output: OutputOpt = OutputFormat.text) -> None:
    """Every table: its mode, partitions, current rows and newest version."""
    with handle_errors(output), open_catalog(home) as cat:
        rows = [_summary(cat, info) for info in cat.store.list_tables()]
        if output is OutputFormat.json:
            emit_json(rows)
        elif rows:
            table_text(rows)
        else:
            console.print("(no tables)")


@app.command("describe", short_help="A table's schema, key, partitions, segments, versions.")
def describe(
    name: Annotated[str, typer.Argument(help="The table.", show_default=False)],
    home: HomeOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """A table's schema, key, mode, comparison column, partitions (shard upper, segments by
    state), and the versions it keeps."""
    with handle_errors(output), open_catalog(home) as cat:
        info = cat.table(name)  # raises TableNotFoundError naming it
        spec = info.spec
        manifest = cat.manifest(name)
        shards = {s.partition: s for s in cat.store.covered_shards(name)}
        segments: dict[int, dict[str, int]] = {}
        for e in manifest.entries:
            per = segments.setdefault(e.partition, {"segments": 0, "rows": 0, "bytes": 0})
            per["segments"] += 1
            per["rows"] += e.row_count
            per["bytes"] += e.size_bytes
            per[str(e.state).lower()] = per.get(str(e.state).lower(), 0) + 1
        partitions = {
            p: {
                "upper": shards[p].upper if p in shards else None,
                "epoch": shards[p].epoch if p in shards else None,
                **segments.get(p, {"segments": 0, "rows": 0, "bytes": 0}),
            }
            for p in sorted(set(shards) | set(segments))
        }
        record = {
            "table": name,
            "mode": spec.mode,
            "schema": dict(spec.columns),
            "primary_key": list(spec.primary_key),
            "comparison_column": spec.comparison_column,
            "delete_column": spec.delete_column,
            "partitioned_by_key": spec.partitioned_by_key,
            "schema_version": info.schema_version,
            "version": manifest.version,
            "oldest_kept_version": cat.store.oldest_kept_version(name),
            "retention": spec.retention.model_dump(),
            "segments": len(manifest.entries),
            "delete_vectors": len(manifest.delete_vectors),
            "partitions": partitions,
        }
        if output is OutputFormat.json:
            emit_json(record)
            return
        key = ", ".join(spec.primary_key) or "(none)"
        lines = [
            f"table {name}: {spec.mode}, key {key}, comparison column "
            f"{spec.comparison_column or '(none)'}",
            f"versions {record['oldest_kept_version']}..{manifest.version} kept "
            f"(schema version {info.schema_version}); {len(manifest.entries)} segments, "
            f"{len(manifest.delete_vectors)} delete vectors",
            "schema:",
            *(f"  {c}: {t}" for c, t in spec.columns.items()),
        ]
        for line in lines:
            console.print(line, highlight=False, markup=False)
        if partitions:
            table_text(
                [
                    {
                        "partition": p,
                        "shard upper": v["upper"],
                        "segments": v["segments"],
                        "by state": ", ".join(
                            f"{v[s]} {s}"
                            for s in ("consuming", "online", "committing", "error")
                            if v.get(s)
                        ),
                        "rows stored": v["rows"],
                        "bytes": v["bytes"],
                    }
                    for p, v in partitions.items()
                ]
            )


@app.command("maintain", short_help="Expire old versions, delete unreferenced files.")
def maintain(
    tables: Annotated[
        list[str] | None,
        typer.Argument(help="Tables to maintain (default: every table).", show_default=False),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing.")
    ] = False,
    grace: Annotated[
        float,
        typer.Option(
            help="Only delete unreferenced files older than this many seconds (a writer's "
            "staged files are unreferenced until its commit).",
        ),
    ] = DEFAULT_GRACE_SECONDS,
    home: HomeOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """Expire the versions each table's retention no longer keeps, then delete the files no
    kept version references. Prints one line per table."""
    # lazy: only the command that runs needs it; keeps `millstream --help` fast
    from millstream.table.maintain import maintain as run_maintenance

    with handle_errors(output):
        if grace < MIN_GRACE_SECONDS:
            raise InvalidSpecError(
                "--grace",
                f"{grace:g} s is shorter than {MIN_GRACE_SECONDS:g} s: a running writer's staged "
                "files are unreferenced until its commit, which accepts files that old",
            )
    with handle_errors(output), open_catalog(home) as cat:
        names = tables or [t.name for t in cat.store.list_tables()]
        reports = [
            run_maintenance(cat.store, cat.deep, name, dry_run=dry_run, grace_seconds=grace)
            for name in names
        ]
        if output is OutputFormat.json:
            emit_json([r.to_dict() for r in reports])
        else:
            for r in reports:
                console.print(r.describe(), highlight=False, soft_wrap=True)


@app.command("compact", short_help="Merge the sealed segments that are due.")
def compact(
    table: Annotated[str, typer.Argument(help="The table whose sealed segments to merge.")],
    partition: Annotated[
        list[int] | None,
        typer.Option(help="Only this partition (repeatable; default: every partition)."),
    ] = None,
    min_segments: Annotated[
        int,
        typer.Option(min=2, help="Merge windows of at least this many similar segments."),
    ] = 4,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be merged; merge nothing.")
    ] = False,
    home: HomeOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """Merge each partition's sealed segments that are due, as the background sealer does
    after its seals (a running sealer whose partition this changes rebuilds its key index
    once). Prints one line per partition."""
    # lazy: only the command that runs needs it; keeps `millstream --help` fast
    from millstream.sealing.compaction import CompactionPolicy
    from millstream.sealing.keyindex import IndexCache
    from millstream.sealing.sealer import Sealer

    with handle_errors(output), open_catalog(home) as cat:
        sealer = Sealer(
            cat,
            table,
            compaction=CompactionPolicy(min_segments=min_segments),
            index_cache=IndexCache(),
        )
        known = sealer.partitions()  # raises NotFoundError naming the table
        for p in partition or []:
            if p not in known:
                raise InvalidSpecError("--partition", f"table {table!r} has no partition {p}")
        reports: list[dict[str, object]] = []
        for p in partition or known:
            plan = sealer.plan_compaction(p)
            if plan is None:
                reports.append({"partition": p, "compacted": False, "plan": None})
            elif dry_run:
                reports.append({"partition": p, "compacted": False, "plan": plan.to_dict()})
            else:
                result = sealer.compact_partition(p)
                reports.append(
                    {
                        "partition": p,
                        "compacted": result is not None,
                        "plan": plan.to_dict(),
                        "segment": None if result is None else result.merged.name,
                        "rows": None if result is None else result.rows_out,
                    }
                )
        if output is OutputFormat.json:
            emit_json({"table": table, "dry_run": dry_run, "partitions": reports})
            return
        for r in reports:
            plan_d = r["plan"]
            if not isinstance(plan_d, dict):
                line = "nothing to merge"
            else:
                what = (
                    f"{len(plan_d['segments'])} segments ({plan_d['rows']} rows, "
                    f"{plan_d['delete_vectors']} delete vectors; {plan_d['reason']})"
                )
                if dry_run:
                    line = f"would merge {what}"
                elif r["compacted"]:
                    line = f"merged {what} into {r['segment']} ({r['rows']} rows)"
                else:
                    line = f"did not merge {what}: the partition changed meanwhile"
            console.print(f"{table} partition {r['partition']}: {line}", highlight=False)


@app.command("iceberg", short_help="Publish and print the Iceberg metadata location of a table.")
def iceberg(
    table: Annotated[str, typer.Argument(help="The table whose Iceberg view to show.")],
    publish: Annotated[
        bool,
        typer.Option(
            "--publish/--no-publish",
            help="Publish the table's current version first (if not published yet).",
        ),
    ] = True,
    home: HomeOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """Print the location of the table's current Iceberg metadata file, for DuckDB's
    ``iceberg_scan`` and pyiceberg's ``StaticTable.from_metadata``. By default the table's
    current version is published first, so the location shows it."""
    # lazy: only the command that runs needs it; keeps `millstream --help` fast
    from millstream.errors import NotFoundError
    from millstream.table.iceberg import location
    from millstream.table.iceberg import publish as publish_view

    with handle_errors(output), open_catalog(home) as cat:
        cat.store.get_table(table)  # raises TableNotFoundError naming the table
        if publish:
            pointer = publish_view(cat.store, cat.deep, table).pointer
        else:
            pointer = cat.store.read_pointer(table)
        if pointer is None:
            # Nothing committed yet (or, with --no-publish, nothing published yet).
            raise NotFoundError("Iceberg view of table", table)
        if output is OutputFormat.json:
            emit_json(
                {
                    "table": table,
                    "metadata_location": location(cat.deep, pointer.metadata_location),
                    "manifest_version": pointer.manifest_version,
                    "snapshot_id": pointer.manifest_version,
                }
            )
        else:
            where = location(cat.deep, pointer.metadata_location)
            console.print(where, highlight=False, soft_wrap=True)
