"""Prometheus metrics, computed at scrape time from the metadata store and the sources.

Each app owns its own ``CollectorRegistry`` (no process-global state), holding one collector.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from millstream.api.context import ApiContext
from millstream.api.rows import LiveRows
from millstream.api.sealing import debug_info
from millstream.api.status import (
    consuming_info,
    tables_written,
    upstream_offsets,
    writer_health,
)
from millstream.control.workers import list_workers
from millstream.core.lifecycle import State
from millstream.datastream import dead_letter_spec
from millstream.errors import NotFoundError
from millstream.metastore.jobs import unrecoverable_segments
from millstream.sealing.reingest import RETENTION_EXPIRED, SOURCE_GONE

#: Datastreams whose table may not exist (yet, or any more): no per-partition metrics.
_NO_TABLE = frozenset({State.INITIALIZING, State.DELETING})


class MillstreamCollector:
    def __init__(self, ctx: ApiContext, live_rows: LiveRows | None = None) -> None:
        self.ctx = ctx
        #: shared with the console's table page (``/tables/{t}/segments``' ``live_rows``)
        self.live_rows = live_rows or LiveRows(ctx.catalog, clock=ctx.clock)

    def describe(self) -> Iterator[Any]:
        yield from self._families()
        yield from self._repair_families()
        yield from self._row_families()
        yield from self._health_families()
        yield from self._iceberg_families()

    def _families(self) -> tuple[Any, ...]:
        return (
            GaugeMetricFamily(
                "millstream_ingestion_delay_ms",
                "Pinot's realtimeIngestionDelayMs: now minus the timestamp of the partition's "
                "last committed record (Kafka's record timestamp; for files and generator "
                "sources, which have none, the time the writer read it); 0 when the shard "
                "upper is the source's latest offset. Absent before the first record.",
                labels=["table", "partition"],
            ),
            GaugeMetricFamily(
                "millstream_availability_lag_ms",
                "0 when caught up (shard upper = source latest offset), else ms since the "
                "last commit that advanced the shard.",
                labels=["table", "partition"],
            ),
            GaugeMetricFamily(
                "millstream_offset_lag",
                "Source latest offset minus shard upper (records not yet committed).",
                labels=["table", "partition"],
            ),
            GaugeMetricFamily(
                "millstream_table_rows",
                "Live rows: what a read of the current table returns (keyed tables after "
                "merging each key's versions and dropping deleted keys, counted by a read once "
                "per manifest version; append tables from the manifest's row counts). A keyed "
                "table's new version shows once its count is done (the last counted until).",
                labels=["table"],
            ),
            CounterMetricFamily(
                "millstream_commit_conflicts",
                "Lost compare-and-sets retried by this controller, plus those workers report.",
            ),
            GaugeMetricFamily("millstream_datastreams", "Datastreams by state.", labels=["state"]),
            GaugeMetricFamily("millstream_workers_alive", "Workers heartbeating within the TTL."),
            GaugeMetricFamily(
                "millstream_segments_in_error",
                "Segments whose seal keeps failing.",
                labels=["table"],
            ),
            GaugeMetricFamily(
                "millstream_seal_lag_segments",
                "Consuming segments waiting to be sealed.",
                labels=["table", "partition"],
            ),
            GaugeMetricFamily(
                "millstream_seal_duration_seconds",
                "Duration of the last seal a worker reported.",
                labels=["datastream", "worker"],
            ),
            GaugeMetricFamily(
                "millstream_pauseless_enabled",
                "1 if consumption continues while segments seal.",
                labels=["datastream"],
            ),
            CounterMetricFamily(
                "millstream_background_errors",
                "Errors a worker's supervised background loop caught (logged with the table, "
                "retried with backoff); table is empty for the loop itself. The loop's status "
                "(last error, failures in a row, last success) is in /tables/{t}/debugInfo.",
                labels=["loop", "table", "worker"],
            ),
            CounterMetricFamily(
                "millstream_maintenance_files_removed",
                "Unreferenced data files a worker's maintenance deleted (after expiry).",
                labels=["table", "worker"],
            ),
            CounterMetricFamily(
                "millstream_maintenance_bytes_removed",
                "Bytes of the data files a worker's maintenance deleted.",
                labels=["table", "worker"],
            ),
            CounterMetricFamily(
                "millstream_maintenance_versions_expired",
                "Manifest versions a worker's maintenance expired (retention).",
                labels=["table", "worker"],
            ),
            GaugeMetricFamily(
                "millstream_maintenance_last_run_timestamp_seconds",
                "When a worker last maintained the table (expiry + GC).",
                labels=["table", "worker"],
            ),
        )

    def collect(self) -> Iterator[Any]:
        ctx = self.ctx
        store = ctx.catalog.store
        (
            delay,
            availability,
            lag,
            rows,
            conflicts,
            datastreams,
            alive,
            in_error,
            seal_lag,
            seal_s,
            pauseless,
            background_errors,
            files_removed,
            bytes_removed,
            versions_expired,
            last_maintained,
        ) = self._families()
        records = ctx.registry.list()
        live = [r for r in records if r.state not in _NO_TABLE]
        written = tables_written(ctx, live)
        upstream = upstream_offsets(
            [s for _, _, s in written if s is not None], ctx.upstream_timeout, by_table=True
        )
        for rec, table, _ in written:
            try:
                info = consuming_info(ctx, table, rec, upstream.get(table))
            except NotFoundError:
                continue
            for p in info.partitions:
                labels = [info.table, str(p.partition)]
                if p.ingestion_delay_ms is not None:
                    delay.add_metric(labels, p.ingestion_delay_ms)
                if p.availability_lag_ms is not None:
                    availability.add_metric(labels, p.availability_lag_ms)
                if p.records_lag is not None:
                    lag.add_metric(labels, p.records_lag)
        for table, n in self.live_rows.rows().items():
            rows.add_metric([table], n)
        now = ctx.clock.now()
        workers = list_workers(store)
        reported = sum(
            int(w.info.get("commit_conflicts", 0)) + int(w.info.get("lost_races", 0))
            for w in workers
        )
        conflicts.add_metric([], store.conflicts + reported)
        by_state = Counter(r.state for r in records)
        for state in State:
            datastreams.add_metric([state.value], by_state.get(state, 0))
        alive.add_metric([], sum(1 for w in workers if w.alive(now, ctx.worker_ttl)))
        for rec in live:
            pauseless.add_metric([rec.name], 1.0 if rec.spec.segments.pauseless else 0.0)
        for _, table, _ in written:
            try:
                debug = debug_info(ctx, table)
            except NotFoundError:
                continue
            in_error.add_metric([table], len(debug["segments_in_error"]))
            for q in debug["sealer_queue"]:
                seal_lag.add_metric([table, str(q["partition"])], q["segments"])
        for w in workers:
            for ds, st in (w.info.get("sealing") or {}).items():
                if st.get("last_seal_seconds") is not None:
                    seal_s.add_metric([ds, w.id], float(st["last_seal_seconds"]))
            for loop in w.info.get("loops") or []:
                background_errors.add_metric(
                    [str(loop["loop"]), str(loop.get("table") or ""), w.id], int(loop["errors"])
                )
            for table, m in (w.info.get("maintenance") or {}).items():
                files_removed.add_metric([table, w.id], int(m["files_removed"]))
                bytes_removed.add_metric([table, w.id], int(m["bytes_removed"]))
                versions_expired.add_metric([table, w.id], int(m["versions_expired"]))
                if m.get("last_run_at") is not None:
                    last_maintained.add_metric([table, w.id], float(m["last_run_at"]))
        yield from (
            delay,
            availability,
            lag,
            rows,
            conflicts,
            datastreams,
            alive,
            in_error,
            seal_lag,
            seal_s,
            pauseless,
            background_errors,
            files_removed,
            bytes_removed,
            versions_expired,
            last_maintained,
        )
        yield from self._repair_metrics([t for _, t, _ in written])
        yield from self._row_counters(workers)
        yield from self._health_metrics(records, workers)
        yield from self._claim_metrics(workers)
        yield from self._iceberg_metrics(
            [n for _, t, _ in written for n in (t, dead_letter_spec(t).name)],
            workers,
        )

    @staticmethod
    def _iceberg_families() -> tuple[
        GaugeMetricFamily,
        CounterMetricFamily,
        CounterMetricFamily,
        CounterMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
    ]:
        return (
            GaugeMetricFamily(
                "millstream_iceberg_publish_lag_seconds",
                "Age of the oldest committed manifest version the table's newest Iceberg "
                "snapshot does not cover (0: it covers the current version). Shown for tables "
                "with a view, and for all while workers publish (--iceberg-publish-interval).",
                labels=["table"],
            ),
            CounterMetricFamily(
                "millstream_iceberg_publishes",
                "Iceberg snapshots a worker published (its failures are "
                'millstream_background_errors{loop="publisher"}).',
                labels=["table", "worker"],
            ),
            CounterMetricFamily(
                "millstream_iceberg_gc_reference_hits",
                "View files whose references a worker's Iceberg view garbage collection found "
                "kept (not read again), over its process's life; per pass in debugInfo.",
                labels=["worker"],
            ),
            CounterMetricFamily(
                "millstream_iceberg_gc_reference_misses",
                "View files a worker's Iceberg view garbage collection read (not kept, or "
                "evicted past the references' bound), over its process's life.",
                labels=["worker"],
            ),
            GaugeMetricFamily(
                "millstream_iceberg_gc_references",
                "References a worker's Iceberg view garbage collection holds (bounded; past "
                "the bound the least recently used go and are read again).",
                labels=["worker"],
            ),
            GaugeMetricFamily(
                "millstream_iceberg_gc_last_pass_cpu_seconds",
                "CPU seconds of a worker's last maintenance pass's Iceberg view collections.",
                labels=["worker"],
            ),
        )

    def _iceberg_metrics(self, tables: list[str], workers: list[Any]) -> Iterator[Any]:
        lag, publishes, hits, misses, held, pass_cpu = self._iceberg_families()
        store = self.ctx.catalog.store
        now = self.ctx.clock.now()
        publishing = bool(self.ctx.control.iceberg_publish_interval)
        for table in tables:
            if not publishing and store.read_pointer(table) is None:
                continue
            seconds = store.publish_lag(table, now)
            if seconds is not None:
                lag.add_metric([table], seconds)
        for w in workers:
            for table, m in (w.info.get("maintenance") or {}).items():
                view = m.get("iceberg")
                if view is not None:
                    publishes.add_metric([table, w.id], int(view.get("publishes", 0)))
            gc = w.info.get("view_gc")
            if gc:
                refs = gc.get("references") or {}
                hits.add_metric([w.id], int(refs.get("hits", 0)))
                misses.add_metric([w.id], int(refs.get("misses", 0)))
                held.add_metric([w.id], int(refs.get("references", 0)))
                pass_cpu.add_metric([w.id], float(gc["last_pass"]["cpu_seconds"]))
        yield from (lag, publishes, hits, misses, held, pass_cpu)

    @staticmethod
    def _health_families() -> tuple[
        GaugeMetricFamily, CounterMetricFamily, CounterMetricFamily, GaugeMetricFamily
    ]:
        return (
            GaugeMetricFamily(
                "millstream_datastream_stalled",
                "1 while a READY datastream's writer is stalled: its shard upper has not moved "
                "for the stall time (--stall-seconds) while its source holds newer records, "
                "until it is seen advancing again after the watchdog restarted it; else 0.",
                labels=["datastream"],
            ),
            CounterMetricFamily(
                "millstream_writer_stall_restarts",
                "Restarts of a stalled writer by a worker's watchdog.",
                labels=["datastream", "worker"],
            ),
            CounterMetricFamily(
                "millstream_writer_transient_restarts",
                "Restarts of a writer's query from its shard uppers, after a backoff, on "
                "Spark's transient failures (a Python process that did not connect back to "
                "its JVM in time: an overloaded machine); the writer did not fail.",
                labels=["datastream", "worker"],
            ),
            GaugeMetricFamily(
                "millstream_writer_restarts_in_a_row",
                "Restarts in a row of a writer's query from its shard uppers after fenced, "
                "gapped or expired commits (a rollback, another writer), with no commit in "
                "between: 0 once it committed past where it started after the last one; the "
                "writer fails when they pass 10.",
                labels=["datastream", "worker"],
            ),
        )

    def _health_metrics(self, records: list[Any], workers: list[Any]) -> Iterator[Any]:
        stalled, restarts, transient, in_a_row = self._health_families()
        for name, h in sorted(writer_health(self.ctx, records).items()):
            stalled.add_metric([name], 1.0 if h.status == "stalled" else 0.0)
        transients: Counter[tuple[str, str]] = Counter()
        rows: Counter[tuple[str, str]] = Counter()  # a datastream's worst table
        for w in workers:
            for wr in w.info.get("writers") or []:
                n = (wr.get("health") or {}).get("stall_restarts")
                if n:
                    restarts.add_metric([str(wr["datastream"]), w.id], int(n))
                # the most any of a datastream's writers (its tables) saw: one query restart
                t = int((wr.get("health") or {}).get("transient_restarts") or 0)
                key = (str(wr["datastream"]), w.id)
                transients[key] = max(transients[key], t)
                rows[key] = max(
                    rows[key], int((wr.get("health") or {}).get("restarts_in_a_row") or 0)
                )
        for (ds, worker), n in sorted(transients.items()):
            if n:
                transient.add_metric([ds, worker], n)
        for (ds, worker), n in sorted(rows.items()):
            in_a_row.add_metric([ds, worker], n)
        yield from (stalled, restarts, transient, in_a_row)

    @staticmethod
    def _claim_metrics(workers: list[Any]) -> Iterator[Any]:
        """The seal-claim renewals of each worker's sealer, per datastream (from its
        heartbeat's ``sealing``)."""
        families = {
            "claim_renewals": CounterMetricFamily(
                "millstream_seal_claim_renewals",
                "Renewals of a running seal's claim a worker's sealer made (every third of the "
                "claim's TTL while a seal builds).",
                labels=["datastream", "worker"],
            ),
            "claim_renewal_failures": CounterMetricFamily(
                "millstream_seal_claim_renewal_failures",
                "Renewals of a seal's claim that failed (the metadata store unreachable) and "
                "were tried again at the next renewal.",
                labels=["datastream", "worker"],
            ),
            "claims_lost": CounterMetricFamily(
                "millstream_seal_claims_lost",
                "Seal claims the metadata store refused to renew (expired on its clock, or "
                "taken over by another sealer): the seal was discarded and retried.",
                labels=["datastream", "worker"],
            ),
            "passes_skipped": CounterMetricFamily(
                "millstream_seal_passes_skipped",
                "Sealing passes that skipped their table's manifest read: nothing due since a read "
                "that found nothing due (the table unchanged, or only appended to, with no run "
                "due by rows, bytes, age or force commit).",
                labels=["datastream", "worker"],
            ),
        }
        for w in workers:
            for ds, st in sorted((w.info.get("sealing") or {}).items()):
                for key, family in families.items():
                    if key in st:
                        family.add_metric([ds, w.id], int(st[key]))
        yield from families.values()

    def _repair_families(self) -> tuple[GaugeMetricFamily, CounterMetricFamily]:
        return (
            GaugeMetricFamily(
                "millstream_segments_unrecoverable",
                "Segments whose data file is lost and whose source range is gone (retention "
                "expired, or the source truncated or its files deleted): automatic repair "
                "cannot rebuild them. 0 for every table and reason otherwise.",
                labels=["table", "reason"],
            ),
            CounterMetricFamily(
                "millstream_auto_repairs",
                "Automatic re-ingest jobs of lost segments this controller ran, by outcome "
                "(started, succeeded, failed, unrecoverable, lost: taken over meanwhile).",
                labels=["table", "outcome"],
            ),
        )

    def _repair_metrics(self, tables: list[str]) -> Iterator[Any]:
        ctx = self.ctx
        unrecoverable, repairs = self._repair_families()
        now = ctx.clock.now()
        for table in sorted(set(tables)):
            try:
                manifest = ctx.catalog.manifest(table)
            except NotFoundError:
                continue
            jobs = unrecoverable_segments(ctx.catalog.store.reingest_jobs(table), manifest, now)
            by_reason = Counter(j.unrecoverable for j in jobs)
            for reason in sorted({RETENTION_EXPIRED, SOURCE_GONE, *filter(None, by_reason)}):
                unrecoverable.add_metric([table, reason], by_reason.get(reason, 0))
        if ctx.controller is not None:
            for (table, outcome), n in sorted(ctx.controller.reingest.auto_outcomes.items()):
                repairs.add_metric([table, outcome], n)
        yield from (unrecoverable, repairs)

    @staticmethod
    def _row_families() -> tuple[CounterMetricFamily, ...]:
        labels = ["datastream", "table", "partition", "worker"]
        return (
            CounterMetricFamily(
                "millstream_rows_consumed",
                "Source records a worker's writer committed (rows plus bad records), per "
                "partition; a range a peer had committed already is not counted.",
                labels=labels,
            ),
            CounterMetricFamily(
                "millstream_rows_dead_lettered",
                "Bad records a worker's writer committed to the dead-letter table.",
                labels=labels,
            ),
            CounterMetricFamily(
                "millstream_source_records_lost",
                "Source offsets the broker deleted before a worker's writer read them, skipped "
                "because the kafka source says on_data_loss: accept (with the default, fail, "
                "the datastream stops instead: millstream_source_offset_errors). The ranges "
                "are in /tables/{t}/debugInfo.",
                labels=labels,
            ),
            CounterMetricFamily(
                "millstream_rows_superseded",
                "Row versions a worker's sealer resolved away when sealing: duplicates (dedup), "
                "older or out-of-order versions (upsert), rows folded into one (partial), "
                "and the older sealed rows its delete vectors mark superseded. Counted when "
                "sealed, not when consumed (reads merge unsealed rows); 0 for append tables.",
                labels=labels,
            ),
            CounterMetricFamily(
                "millstream_source_offset_errors",
                "Writer failures on source offsets it cannot go on from, by error: SourceGapError "
                "(records the broker deleted before they were read, on_data_loss: fail) and "
                "SourceOffsetsRewoundError (the source's offsets went backwards). The datastream "
                "goes to ERROR; the last error is in /tables/{t}/debugInfo.",
                labels=["datastream", "error", "worker"],
            ),
        )

    def _row_counters(self, workers: list[Any]) -> Iterator[Any]:
        consumed, dead_lettered, lost, superseded, offset_errors = self._row_families()
        for w in workers:
            for r in w.info.get("rows") or []:
                labels = [str(r["datastream"]), str(r["table"]), str(r["partition"]), w.id]
                consumed.add_metric(labels, int(r.get("consumed", 0)))
                dead_lettered.add_metric(labels, int(r.get("dead_lettered", 0)))
                lost.add_metric(labels, int(r.get("lost", 0)))
                superseded.add_metric(labels, int(r.get("superseded", 0)))
            for s in w.info.get("source_offsets") or []:
                for kind, e in sorted((s.get("errors") or {}).items()):
                    offset_errors.add_metric([str(s["datastream"]), kind, w.id], int(e["count"]))
        yield from (consumed, dead_lettered, lost, superseded, offset_errors)


def make_registry(ctx: ApiContext, live_rows: LiveRows | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(MillstreamCollector(ctx, live_rows))
    return registry
