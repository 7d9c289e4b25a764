"""Datastream records and their lifecycle, on the metadata store.

Every transition is a compare-and-set on the record's ``version``, decided by
:mod:`millstream.core.lifecycle`. User commands enqueue an event for the leader; asynchronous
completions apply only if the record is still in the state they expect.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
from typing import Any

from millstream.clock import SYSTEM_CLOCK, Clock
from millstream.control import events
from millstream.core.evolution import Change, check_evolution
from millstream.core.lifecycle import Command, State, check_transition, command_target
from millstream.datastream import DatastreamSpec, KafkaSource
from millstream.errors import (
    AlreadyExistsError,
    IncompatibleChangeError,
    InvalidSpecError,
    NotFoundError,
    PreconditionFailedError,
)
from millstream.metastore import datastreams, owners, tables
from millstream.metastore.datastreams import DatastreamRecord
from millstream.metastore.engine import Txn
from millstream.metastore.evolve import evolve_with_dead_letter
from millstream.metastore.store import MetadataStore
from millstream.spec import DEAD_LETTER_SUFFIX, Retention, dead_letter_name


def _differences(old: Any, new: Any, path: str) -> str | None:
    """The first field (dotted path) where two JSON values differ, else None."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in [*old, *(k for k in new if k not in old)]:
            found = _differences(old.get(key), new.get(key), f"{path}.{key}" if path else key)
            if found is not None:
                return found
        return None
    return None if old == new else path


#: Source fields an update may change: what the writer does about records the broker deleted
#: before they were read (an operator accepting a loss the datastream stopped at).
UPDATABLE_SOURCE_FIELDS = ("on_data_loss",)


def _settings_changed(old: DatastreamSpec, new: DatastreamSpec) -> bool:
    """Whether an :data:`UPDATABLE_SOURCE_FIELDS` field differs."""
    before, after = old.source.model_dump(), new.source.model_dump()
    return any(before.get(f) != after.get(f) for f in UPDATABLE_SOURCE_FIELDS)


def _fixed(spec: DatastreamSpec) -> dict[str, Any]:
    out: dict[str, Any] = spec.model_dump(mode="json", by_alias=True, exclude={"columns", "table"})
    for f in UPDATABLE_SOURCE_FIELDS:
        out["source"].pop(f, None)
    return out


def _single_table(name: str, spec: DatastreamSpec) -> None:
    if spec.multi_table:
        raise InvalidSpecError(
            "source.topic",
            f"datastream {name!r} writes a table per topic: an update keeps its "
            "source.topics or source.topic_pattern (create another datastream instead)",
        )


#: What an update of a datastream of many topics may change besides its ``overrides`` (of
#: topics whose tables do not exist yet; a table that exists may change its retention only)
#: and the topics its ``source.topics`` lists (added, never removed).
MULTI_UPDATABLE = (
    ("source", "topic_poll_interval"),
    ("source", "on_data_loss"),
    ("table", "retention"),
)


def _fixed_multi(spec: DatastreamSpec) -> dict[str, Any]:
    out: dict[str, Any] = spec.model_dump(mode="json", by_alias=True)
    out.pop("overrides", None)
    out["source"].pop("topics", None)
    for section, f in MULTI_UPDATABLE:
        out[section].pop(f, None)
    return out


def _multi_changes(conn: Txn, rec: DatastreamRecord, spec: DatastreamSpec) -> list[Change]:
    """The changes from ``rec``'s spec (a datastream of many topics) to ``spec`` that touch
    no table (topics added, settings, overrides of tables not made yet), or
    :class:`IncompatibleChangeError` naming the first field that may not change."""
    old, name = rec.spec, rec.name
    rule = (
        f"datastream {name!r} writes a table per topic: an update may add topics to "
        "source.topics, change source.topic_poll_interval, source.on_data_loss, "
        "table.retention and the overrides of topics whose tables do not exist yet (the "
        "retention of those that do)"
    )
    before, after = _fixed_multi(old), _fixed_multi(spec)
    field = _differences(before, after, "")
    if field is not None:
        raise IncompatibleChangeError(
            name, field, None, rule, f"{_at(before, field)!r} -> {_at(after, field)!r}"
        )
    changes: list[Change] = []
    src, new_src = old.source, spec.source
    assert isinstance(src, KafkaSource) and isinstance(new_src, KafkaSource)
    if src.topics is not None and new_src.topics is not None:
        removed = [t for t in src.topics if t not in new_src.topics]
        if removed:
            raise IncompatibleChangeError(
                name,
                "source.topics",
                None,
                rule + "; a topic's table stays (delete the datastream to drop it)",
                f"topic {removed[0]!r} removed",
            )
        changes += [
            Change("topic", t, None, spec.table_name_of(t))
            for t in new_src.topics
            if t not in src.topics
        ]
    for section, f in MULTI_UPDATABLE[:2]:
        was, now = getattr(src, f), getattr(new_src, f)
        if was != now:
            changes.append(Change("setting", f"{section}.{f}", str(was), str(now)))
    for topic in sorted(set(old.overrides) | set(spec.overrides)):
        was_ov, now_ov = old.overrides.get(topic), spec.overrides.get(topic)
        if was_ov == now_ov:
            continue
        was_d = was_ov.model_dump(mode="json", by_alias=True, exclude_none=True) if was_ov else {}
        now_d = now_ov.model_dump(mode="json", by_alias=True, exclude_none=True) if now_ov else {}
        table = old.table_name_of(topic)
        if tables.find_table(conn, table, missing_ok=True) is not None:
            was_d.pop("retention", None)
            now_d.pop("retention", None)
            differs = _differences(was_d, now_d, "")
            if differs is not None:
                raise IncompatibleChangeError(
                    table,
                    f"overrides.{topic}.{differs}",
                    None,
                    f"topic {topic!r}'s table exists: its override may change its retention only",
                    f"{_at(was_d, differs)!r} -> {_at(now_d, differs)!r}",
                )
            continue  # its retention: a change of its table (see _update_multi)
        changes.append(
            Change("setting", f"overrides.{topic}", json.dumps(was_d), json.dumps(now_d))
        )
    return changes


def _retention_of(spec: DatastreamSpec, table: str) -> Retention:
    """The retention ``spec`` gives its table ``table``: an override's (of the topic whose
    table it is), else ``table.retention``, else the default."""
    for topic, ov in spec.overrides.items():
        if spec.table_name_of(topic) == table and ov.retention is not None:
            return ov.retention
    return spec.table.retention or Retention()


def _names(spec: DatastreamSpec) -> list[str]:
    """A single-table spec's table and dead-letter table."""
    return [spec.table_name, spec.dead_letter_table]


def _check_fixed_fields(old: DatastreamSpec, new: DatastreamSpec) -> None:
    """Everything but the schema, the table section (which the evolution rules check) and
    :data:`UPDATABLE_SOURCE_FIELDS` must stay as it is: a source, segment or replica change
    needs a new datastream today."""
    before = _fixed(old)
    after = _fixed(new)
    field = _differences(before, after, "")
    if field is not None:
        raise IncompatibleChangeError(
            old.table_name,
            field,
            None,
            "an update may change only the schema and table.retention (and source.on_data_loss)",
            f"{_at(before, field)!r} -> {_at(after, field)!r}",
        )


def _at(data: Any, path: str) -> Any:
    for part in path.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


#: What an update returns: the record, the changes, the table's schema version (if it exists).
Update = tuple[DatastreamRecord, list[Change], int | None]


class Registry:
    def __init__(self, store: MetadataStore, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.clock = clock

    # -- reads -----------------------------------------------------------------------------

    def _get(self, conn: Txn, name: str) -> DatastreamRecord | None:
        return datastreams.find(conn, name)

    def get(self, name: str) -> DatastreamRecord:
        with self.store.read() as conn:
            rec = self._get(conn, name)
        if rec is None:
            raise NotFoundError("datastream", name)
        return rec

    def find(self, name: str) -> DatastreamRecord | None:
        with self.store.read() as conn:
            return self._get(conn, name)

    def list(self) -> list[DatastreamRecord]:
        with self.store.read() as conn:
            return datastreams.list_all(conn)

    def owner_of(self, table: str) -> str | None:
        """The datastream that owns ``table`` (None: no datastream does)."""
        with self.store.read() as conn:
            return owners.owners(conn, [table]).get(table)

    def tables_of(self, name: str) -> builtins.list[str]:
        """The tables datastream ``name`` writes (owns), dead-letter tables left out: its
        one table, or every table of a multi-table datastream made so far."""
        with self.store.read() as conn:
            owned = owners.owned_by(conn, name)
        return [t for t in owned if not t.endswith(DEAD_LETTER_SUFFIX)]

    # -- user commands ---------------------------------------------------------------------

    def create(self, spec: DatastreamSpec) -> DatastreamRecord:
        """Insert the datastream in INITIALIZING and ask the leader to set it up. Its table
        and dead-letter table must not belong to another datastream (:class:`TableOwnedError`)."""
        # validated already; a multi-table spec's listed topics' tables (a topic_pattern's
        # are claimed as its topics are found)
        claimed = [n for t in spec.declared_tables().values() for n in _names(t)]

        def _txn(conn: Txn) -> DatastreamRecord:
            if self._get(conn, spec.name) is not None:
                raise AlreadyExistsError("datastream", spec.name)
            now = self.clock.now()
            # Its table and dead-letter table become its own (TableOwnedError, a 409 naming
            # the other datastream, if one owns either): in this transaction, so two creates
            # racing for one table cannot both insert (the owner row's key decides).
            owners.claim_tables(conn, claimed, spec.name, now)
            datastreams.insert_new(conn, spec, now)
            events.enqueue(conn, spec.name, events.CREATE, now)
            rec = self._get(conn, spec.name)
            assert rec is not None
            return rec

        rec, _ = self.store.retrying(_txn)
        return rec

    def update(self, name: str, spec: DatastreamSpec, *, dry_run: bool = False) -> Update:
        """Change a datastream's spec to ``spec``: its schema (compatible changes only, see
        :mod:`millstream.core.evolution`) and its table's retention; every other field must
        stay as it is (:class:`IncompatibleChangeError` naming the first that differs).

        ONE transaction: the table's compare-and-set and new schema version
        (:func:`millstream.metastore.tables.evolve_table`), the dead-letter table's retention,
        and the datastream row's compare-and-set. A concurrent update makes a compare-and-set
        lose; the retry re-reads both rows and checks the change against the winner's spec.
        ``dry_run`` checks and returns the changes without writing. Returns the record, the
        changes (empty: nothing to do, nothing written) and the table's schema version (None
        before the leader created the table). A datastream of many topics changes as
        :meth:`_update_multi` allows (its schema version: None)."""
        if spec.name != name:
            raise InvalidSpecError("name", f"{spec.name!r} is not the datastream {name!r}")
        if spec.multi_table:
            return self._update_multi(name, spec, dry_run=dry_run)
        new_table = spec.table_spec()

        def _txn(conn: Txn) -> Update:
            rec = self._get(conn, name)
            if rec is None:
                raise NotFoundError("datastream", name)
            _single_table(name, rec.spec)
            _check_fixed_fields(rec.spec, spec)
            if new_table.name != rec.spec.table_name:
                # Its table names are its own (owners.claim_tables); another name may be
                # another datastream's table, which this update would evolve and then write.
                raise IncompatibleChangeError(
                    rec.spec.table_name,
                    "table.name",
                    None,
                    "a datastream's table cannot change (create another datastream)",
                    f"{rec.spec.table_name} -> {new_table.name}",
                )
            table = tables.find_table(conn, new_table.name, missing_ok=True)
            if table is None:  # not created yet: the leader creates it from the new spec
                changes = check_evolution(rec.spec.table_spec(), new_table)
                schema_version = None
            elif dry_run:
                changes = check_evolution(table.spec, new_table)
                schema_version = table.schema_version
            else:
                info, changes = evolve_with_dead_letter(conn, self.store.clock, new_table)
                schema_version = info.schema_version
            if dry_run or not (changes or _settings_changed(rec.spec, spec)):
                return rec, changes, schema_version
            datastreams.set_spec(conn, name, rec.version, spec, self.clock.now())
            new = self._get(conn, name)
            assert new is not None
            return new, changes, schema_version

        result, _ = self.store.retrying(_txn)
        return result

    def _update_multi(self, name: str, spec: DatastreamSpec, *, dry_run: bool) -> Update:
        """:meth:`update` of a datastream of many topics, in ONE transaction: the changes
        :func:`_multi_changes` allows; the retention of each of its tables that exists (and
        of its dead-letter table), each a compare-and-set of the table row; the claim of the
        tables of the topics added (:class:`TableOwnedError` if another datastream has one;
        the worker creates them as it runs them); the record's compare-and-set."""

        def _txn(conn: Txn) -> Update:
            rec = self._get(conn, name)
            if rec is None:
                raise NotFoundError("datastream", name)
            if not rec.spec.multi_table:
                raise IncompatibleChangeError(
                    rec.spec.table_name,
                    "source.topic",
                    None,
                    "a datastream's table cannot change (create another datastream)",
                    f"topic {getattr(rec.spec.source, 'topic', None)!r} -> a table per topic",
                )
            changes = _multi_changes(conn, rec, spec)
            owned = [t for t in owners.owned_by(conn, name) if not t.endswith(DEAD_LETTER_SUFFIX)]
            for t in owned:
                stored = tables.find_table(conn, t, missing_ok=True)
                want = _retention_of(spec, t)
                if stored is None or stored.spec.retention == want:
                    continue
                new_table = stored.spec.model_copy(update={"retention": want})
                if dry_run:
                    found = check_evolution(stored.spec, new_table)
                else:
                    _, found = evolve_with_dead_letter(conn, self.store.clock, new_table)
                changes += [dataclasses.replace(c, table=t) for c in found]
            if dry_run or rec.spec == spec:
                return rec, changes, None
            now = self.clock.now()
            added = [c.new for c in changes if c.kind == "topic" and c.new is not None]
            owners.claim_tables(
                conn, [n for t in added for n in (t, dead_letter_name(t))], name, now
            )
            datastreams.set_spec(conn, name, rec.version, spec, now)
            new = self._get(conn, name)
            assert new is not None
            return new, changes, None

        result, _ = self.store.retrying(_txn)
        return result

    def command(self, name: str, command: Command) -> DatastreamRecord:
        """Apply a user command (pause, resume, stop, delete) by compare-and-set.

        Raises NotFoundError, or InvalidTransitionError naming the allowed states. A stop or
        delete enqueues an event for the leader; duplicate in-flight stop events coalesce.
        """

        def _txn(conn: Txn) -> DatastreamRecord:
            rec = self._get(conn, name)
            if rec is None:
                raise NotFoundError("datastream", name)
            target = command_target(name, command, rec.state)
            now = self.clock.now()
            datastreams.set_state(conn, name, rec.version, target, now, None)
            kind = {
                Command.STOP: events.STOP,
                Command.DELETE: events.DELETE,
            }.get(command, events.ASSIGN)
            events.enqueue(conn, name, kind, now)
            new = self._get(conn, name)
            assert new is not None
            return new

        rec, _ = self.store.retrying(_txn)
        return rec

    def pause_table(self, name: str, table: str) -> DatastreamRecord:
        """Pause one table of multi-table datastream ``name``: its writer stops at its shard
        uppers (the workers take it out of their shared query at their next tick) while the
        datastream's other tables run on; :meth:`resume_table` continues exactly there. A
        compare-and-set of the record, like a lifecycle command."""
        return self._table_command(name, table, pause=True)

    def resume_table(self, name: str, table: str) -> DatastreamRecord:
        """Resume a table :meth:`pause_table` paused (its writer rejoins at its uppers)."""
        return self._table_command(name, table, pause=False)

    def _table_command(self, name: str, table: str, *, pause: bool) -> DatastreamRecord:
        verb = "pause" if pause else "resume"

        def _txn(conn: Txn) -> DatastreamRecord:
            rec = self._get(conn, name)
            if rec is None:
                raise NotFoundError("datastream", name)
            if not rec.spec.multi_table:
                raise InvalidSpecError(
                    "table",
                    f"datastream {name!r} writes one table ({rec.spec.table_name!r}): {verb} "
                    "the datastream itself",
                )
            if rec.state is State.DELETING:
                raise PreconditionFailedError(
                    f"datastream {name!r} is DELETING: its tables cannot be {verb}d",
                    datastream=name,
                    table=table,
                    state=rec.state.value,
                )
            # Only a table the datastream owns (made from one of its topics), not a
            # dead-letter table: its writer is its table's.
            if (
                table.endswith(DEAD_LETTER_SUFFIX)
                or owners.owners(conn, [table]).get(table) != name
            ):
                raise NotFoundError(f"datastream {name!r} table", table)
            paused = set(rec.paused_tables)
            if pause == (table in paused):
                raise PreconditionFailedError(
                    f"table {table!r} of datastream {name!r} is "
                    + ("paused already" if pause else "not paused"),
                    datastream=name,
                    table=table,
                    state=rec.state.value,
                )
            paused ^= {table}
            datastreams.set_paused_tables(conn, name, rec.version, sorted(paused), self.clock.now())
            new = self._get(conn, name)
            assert new is not None
            return new

        rec, _ = self.store.retrying(_txn)
        return rec

    # -- asynchronous completions -----------------------------------------------------------

    def complete(self, name: str, *, expected: State, to: State, error: str | None = None) -> bool:
        """Move ``name`` from ``expected`` to ``to`` only if it is still in ``expected``,
        read from the authoritative record inside the transaction (never from a cache).
        Returns whether it applied; a datastream that moved on is left alone."""

        def _txn(conn: Txn) -> bool:
            rec = self._get(conn, name)
            if rec is None or rec.state is not expected:
                return False
            check_transition(name, rec.state, to)
            datastreams.set_state(conn, name, rec.version, to, self.clock.now(), error)
            return True

        applied, _ = self.store.retrying(_txn)
        return bool(applied)

    def fail(self, name: str, error: str) -> bool:
        """Any state -> ERROR (except a datastream being deleted)."""

        def _txn(conn: Txn) -> bool:
            rec = self._get(conn, name)
            if rec is None or rec.state in (State.ERROR, State.DELETING):
                return False
            datastreams.set_state(conn, name, rec.version, State.ERROR, self.clock.now(), error)
            return True

        applied, _ = self.store.retrying(_txn)
        return bool(applied)

    def remove(self, name: str) -> bool:
        """DELETING -> gone, only if still DELETING."""

        def _txn(conn: Txn) -> bool:
            rec = self._get(conn, name)
            if rec is None or rec.state is not State.DELETING:
                return False
            return datastreams.delete_at(conn, name, rec.version)

        applied, _ = self.store.retrying(_txn)
        return bool(applied)


__all__ = ["DatastreamRecord", "Registry", "Update"]
