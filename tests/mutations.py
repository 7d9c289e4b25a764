"""Mutation check: every guard that protects data has a test that fails without it.

For each guard below: copy the repository (tracked and untracked-but-not-ignored files) into a
fresh temporary directory, run the guard's tests there unmutated (they must pass, else BROKEN),
apply ONE textual mutation that removes exactly the guard (``old`` must occur exactly once in
the file, else NOT APPLIED: the list cannot silently rot), run the tests again, and report

* KILLED      the tests failed with the guard removed (good);
* SURVIVED    they passed (bad: nothing catches the guard's removal);
* BROKEN      they fail without the mutation too;
* NOT APPLIED the mutation's ``old`` text is not in the file exactly once, or the mutated file
              does not compile;
* ERROR       pytest ended otherwise (usage error, no tests collected, interrupted, timeout);
* SKIPPED     the guard is listed but not checkable yet (its ``skip`` says why).

Tests run with the repository's interpreter and ``PYTHONPATH=<copy>/src``, so the copy's
``millstream`` shadows the editable install (checked for every copy). Run by hand::

    .venv/bin/python tests/mutations.py [--list] [--only NAME ...] [--markdown PATH]

The exit status is non-zero unless every checked guard was KILLED. Not run in CI.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = REPO / ".venv" / "bin" / "python"
#: Bound for one pytest run (each test has its own 900 s timeout from pyproject.toml).
RUN_TIMEOUT = 3600.0
GUARDS_DOC = 'docs/design.md, "Guards and the tests that catch them"'


@dataclass(frozen=True, slots=True)
class Guard:
    name: str
    #: the file the mutation edits, relative to the repository
    file: str
    #: what the guard protects, one line
    what: str
    old: str
    new: str
    #: pytest node ids (or paths) that must fail once the guard is removed
    tests: tuple[str, ...]
    #: a pytest ``-k`` expression narrowing ``tests``
    select: str | None = None
    #: why the guard is not checked (reported as SKIPPED)
    skip: str | None = None


@dataclass(frozen=True, slots=True)
class Result:
    guard: Guard
    verdict: str
    seconds: float
    baseline_seconds: float = 0.0
    detail: str = ""


MANIFEST = "src/millstream/metastore/manifest.py"
CLAIMS = "src/millstream/metastore/claims.py"
SWAPS = "src/millstream/metastore/swaps.py"
GUARDS_TEST = "tests/contract/test_contract_manifest_guards.py"
COMMIT_CAMPAIGN = "tests/fault/test_commit_path_campaign.py"
AUTO = "tests/unit/ingest/test_schema_evolution_auto.py"
PROTO_TABLES = "tests/unit/ingest/test_protobuf_tables_from_registry.py"
FOOTERS_TEST = "tests/unit/table/test_sealed_reads_trust_only_proven_footers.py"
FILES_SOURCE = "src/millstream/ingest/sources/files.py"
SEALER_FILE = "src/millstream/sealing/sealer.py"
DEAD_LETTERS = "tests/contract/test_dead_letters_only_with_bad_records.py::"
VIEW_GC_TEST = "tests/contract/test_contract_iceberg_view_gc_references.py"
SHARED_COMMIT = "tests/contract/test_postgres_shared_commit.py"
POLL_FILE = "src/millstream/table/poll.py"
POLL_TEST = "tests/unit/table/test_poll_reads.py"
TRANSIENT_TEST = "tests/integration/test_spark_transient_failures.py"
TRANSIENT_UNIT = "tests/unit/test_spark_transient_restarts.py"


def _guard_test(name: str) -> str:
    return f"{GUARDS_TEST}::{name}[sqlite-local]"


GUARDS: tuple[Guard, ...] = (
    Guard(
        name="seal-swap-rechecks-claim",
        file=SWAPS,
        what="replace_run: every claimed entry is live, at its claimed version, and claimed",
        old="""\
            if cur is None or cur.removed_version is not None or cur.row_version != version:
                raise SegmentChangedError(
                    f"the run being sealed in {table} partition {partition} changed (rolled "
                    "back, re-ingested, or claimed by another sealer after this one's claim "
                    "expired); the seal is discarded",
                    table=table,
                    partition=partition,
                )
            entries.append(cur)
        entries.sort(key=lambda e: e.seq)
        new_version = info.manifest_version + 1
        now = clock.now()
        removed = {"removed_version": new_version, "claimed_by": None, "claim_expires_at": None}
        update_entries(conn, [(e.id, claimed[e.id], removed) for e in entries])
""",
        new="""\
            if cur is None:
                continue
            entries.append(cur)  # MUTATION: the claim is not re-checked
        entries.sort(key=lambda e: e.seq)
        new_version = info.manifest_version + 1
        now = clock.now()
        removed = {"removed_version": new_version, "claimed_by": None, "claim_expires_at": None}
        # MUTATION: removed at whatever version it is now
        update_entries(conn, [(e.id, e.row_version, removed) for e in entries])
""",
        tests=(
            _guard_test(
                "test_a_sealer_whose_expired_claim_was_taken_over_cannot_swap_its_stale_seal_in"
            ),
            _guard_test(
                "test_a_sealer_whose_run_a_successor_claimed_but_not_yet_sealed_swaps_nothing"
            ),
        ),
    ),
    Guard(
        name="seal-swap-rechecks-key-index",
        file=SWAPS,
        what="replace_run: the partition's sealed entries and delete vectors are the ones the "
        "seal's key index reflects",
        old="""\
        if sealed.reflects is not None and sealed_state(conn, table, partition) != sealed.reflects:
""",
        new="""\
        if False:  # MUTATION: the key index is not re-checked
""",
        # Only a sealed set that changes under a seal whose run did not change reaches this
        # check (a rollback removes the run too, and the claim re-check fires first): the test
        # re-ingests a sealed segment between a seal's build and its swap. (seed_003's control
        # test also fails without this guard, but because its UnorderedSealer then reads the
        # expected table: that is not a test of the guard, so it is left out.)
        tests=(
            _guard_test(
                "test_a_seal_built_on_a_key_index_that_went_stale_is_discarded_and_retried"
            ),
        ),
    ),
    Guard(
        name="reingest-swap-refuses-removed-entry",
        file=SWAPS,
        what="replace_entry: an entry removed meanwhile (sealed, rolled back) is not swapped",
        old="""\
        if cur is None or cur.removed_version is not None:
            raise SegmentChangedError(
                f"segment {old.name} changed while it was re-ingested""",
        new="""\
        if cur is None:  # MUTATION: a removed entry is swapped all the same
            raise SegmentChangedError(
                f"segment {old.name} changed while it was re-ingested""",
        tests=(_guard_test("test_a_reingestion_of_a_segment_sealed_meanwhile_swaps_nothing"),),
    ),
    Guard(
        name="reingest-swap-compare-and-set",
        file=SWAPS,
        what="replace_entry: the entry's update is a compare-and-set with a rowcount check",
        old="""\
        update_entry(
            conn,
            old.id,
            cur.row_version,  # the version the check saw: a seal since then makes this fail
            {"removed_version": version, "claimed_by": None, "claim_expires_at": None},
        )
""",
        new="""\
        from sqlalchemy import update  # MUTATION: an update whose rowcount nobody checks

        from millstream.metastore import schema as s

        read = cur.row_version
        conn.execute(
            update(s.entries)
            .where(s.entries.c.id == old.id, s.entries.c.version == read)
            .values(
                removed_version=version, claimed_by=None, claim_expires_at=None, version=read + 1
            )
        )
""",
        tests=("tests/contract/test_postgres_manifest_races.py",),
    ),
    Guard(
        name="reingest-unclaims-entry",
        file=SWAPS,
        what="replace_entry: a replaced entry that is not sealed becomes CONSUMING, unclaimed",
        old="""\
        state = SegmentState.ONLINE if cur.state is SegmentState.ONLINE else SegmentState.CONSUMING
""",
        new="""\
        state = cur.state  # MUTATION: a COMMITTING entry stays COMMITTING, claimed by nobody
""",
        # The SQLite test alone lets this survive: an entry left COMMITTING without a claim
        # expiry counts as an expired claim, so sealing is not wedged. The PostgreSQL race test
        # asserts the replaced entry is CONSUMING and unclaimed.
        tests=(
            _guard_test(
                "test_reingesting_a_segment_a_sealer_holds_does_not_wedge_sealing_of_its_partition"
            ),
            "tests/contract/test_postgres_manifest_races.py",
        ),
    ),
    Guard(
        name="claim-takes-over-expired-claim",
        file=CLAIMS,
        what="claim_run: a run whose claim expired may be claimed again",
        old="""\
        if cur.claim_held(now):
            return None
""",
        new="""\
        if cur.state is SegmentState.COMMITTING:  # MUTATION: a claim never expires
            return None
""",
        tests=("tests/unit/sealing/test_dead_sealer_claim.py",),
    ),
    Guard(
        name="claim-respects-live-claim",
        file=CLAIMS,
        what="claim_run: a run another sealer's live claim holds is left alone",
        old="""\
        if cur.claim_held(now):
            return None
""",
        new="""\
        if cur.claim_held(now):
            pass  # MUTATION: a live claim is taken over
""",
        # The first test: two sealers that both read the run unclaimed and then claim it one
        # after the other; the second: a sealer that finds the run claimed.
        tests=(
            _guard_test(
                "test_a_run_claimed_between_reading_it_and_claiming_it_is_not_claimed_twice"
            ),
            _guard_test("test_a_live_claim_is_left_alone"),
        ),
    ),
    Guard(
        name="claim-all-or-nothing",
        file=CLAIMS,
        what="claim_run: every entry's precondition is checked before any entry is claimed",
        old="""\
        if cur.claim_held(now):
            return None
        checked[e.id] = cur.row_version
""",
        new="""\
        if cur.claim_held(now):
            return None
        update_entries(  # MUTATION: each entry claimed as it is checked
            conn,
            [
                (
                    e.id,
                    cur.row_version,
                    {
                        "state": SegmentState.COMMITTING.value,
                        "claimed_by": owner,
                        "claim_expires_at": now + ttl,
                    },
                )
            ],
        )
        checked[e.id] = cur.row_version + 1
""",
        tests=(_guard_test("test_a_claim_that_finds_one_entry_taken_claims_none_of_the_run"),),
    ),
    Guard(
        name="claim-sets-the-version-it-checked",
        file=CLAIMS,
        what="claim_run: the claim's compare-and-set uses the version its check read",
        old="""\
    return update_entries(conn, [(i, v, values) for i, v in checked.items()])
""",
        new="""\
    fresh = get_entries(conn, checked)  # MUTATION: the versions of a second read
    return update_entries(conn, [(i, fresh[i].row_version, values) for i in checked])
""",
        tests=(
            "tests/contract/test_postgres_manifest_races.py::"
            "test_two_sealers_claiming_the_same_run_at_once_get_it_once_on_postgres",
        ),
    ),
    Guard(
        name="seal-keeps-files-after-unknown-outcome",
        file="src/millstream/sealing/sealer.py",
        what="Sealer: the uploaded files stay after a CommitStateUnknownError",
        old="""\
            if not swapping or isinstance(exc, SegmentChangedError | CommitConflictError):
                # The swap never ran, or it refused (precondition) or gave up (lost every
""",
        new="""\
            if True:  # MUTATION: the uploaded files are deleted after every failure
                # The swap never ran, or it refused (precondition) or gave up (lost every
""",
        tests=(
            _guard_test(
                "test_a_seal_whose_commit_did_not_land_keeps_its_files_and_the_run_seals_next_time"
            ),
        ),
    ),
    Guard(
        name="reconcile-rereads-unknown-outcome",
        file=MANIFEST,
        what="reconcile: a COMMIT with an unknown outcome is re-read to see whether it landed",
        old="""\
    except CommitStateUnknownError as exc:
        try:
            with store.read() as conn:
""",
        new="""\
    except CommitStateUnknownError as exc:
        raise  # MUTATION: no re-read
        try:
            with store.read() as conn:
""",
        tests=(
            _guard_test(
                "test_a_seal_whose_commit_landed_with_an_unknown_outcome_keeps_its_file_and_reads_work"
            ),
            _guard_test(
                "test_a_reingestion_whose_commit_landed_with_an_unknown_outcome_keeps_its_file"
            ),
        ),
    ),
    Guard(
        name="reingest-keeps-file-after-unknown-outcome",
        file="src/millstream/sealing/reingest.py",
        what="reingest_segment: the rebuilt file stays after a CommitStateUnknownError",
        old="""\
    except (SegmentChangedError, CommitConflictError, StagedFileExpiredError):
""",
        new="""\
    except BaseException:  # MUTATION: the file is deleted after an unknown outcome too
""",
        tests=(_guard_test("test_a_reingestion_whose_commit_did_not_land_keeps_its_file"),),
    ),
    Guard(
        name="seal-keeps-files-after-interrupted-commit",
        file="src/millstream/sealing/sealer.py",
        what="Sealer: once the swap may have run, only a proven non-landing deletes the files",
        old="""\
            if not swapping or isinstance(exc, SegmentChangedError | CommitConflictError):
                # The swap never ran, or it refused (precondition) or gave up (lost every
""",
        new="""\
            if not isinstance(exc, CommitStateUnknownError):  # MUTATION: the old rule
                # The swap never ran, or it refused (precondition) or gave up (lost every
""",
        tests=(
            _guard_test(
                "test_an_interrupt_during_a_seals_commit_keeps_the_file_the_swap_may_reference"
            ),
        ),
    ),
    Guard(
        name="compaction-keeps-files-after-interrupted-commit",
        file="src/millstream/sealing/sealer.py",
        what="Sealer: once a compaction's swap may have run, only a proven non-landing "
        "deletes the compacted file and its delete vector",
        old="""\
            # As for a seal: files are deleted only if the swap provably did not land.
            if not swapping or isinstance(exc, SegmentChangedError | CommitConflictError):
""",
        new="""\
            # As for a seal: files are deleted only if the swap provably did not land.
            if not isinstance(exc, CommitStateUnknownError):  # MUTATION: the old rule
""",
        tests=(
            _guard_test(
                "test_an_interrupt_during_a_compactions_commit_keeps_the_files_the_swap_references"
            ),
        ),
    ),
    Guard(
        name="commit-keeps-files-after-unknown-outcome",
        file="src/millstream/table/commit.py",
        what="commit_writes: an unknown outcome is reconciled by re-reading; files stay",
        old="""\
    except CommitStateUnknownError:
        if _persisted(store, changes):
            # A peer's or this commit's: the ranges are in the manifest. Files stay for GC.
            return _reconciled(table, dead_letter_table, main, dl, rows)
        raise
""",
        new="",
        tests=(
            f"{GUARDS_TEST}::test_a_batch_commit_with_an_unknown_outcome_keeps_its_files_and_"
            "is_reconciled[sqlite-local-landed]",
            f"{GUARDS_TEST}::test_a_batch_commit_with_an_unknown_outcome_keeps_its_files_and_"
            "is_reconciled[sqlite-local-not-landed]",
        ),
    ),
    Guard(
        name="abort-leaves-files-when-commit-ran",
        file="src/millstream/spark/sink.py",
        what="SegmentSink.abort: deletes staged files only when a write task failed",
        old="""\
        if all(isinstance(m, SinkMessage) for m in messages):
            return
""",
        new="",
        tests=(_guard_test("test_abort_deletes_staged_files_only_when_a_write_task_failed"),),
    ),
    Guard(
        name="rollback-landed-by-epoch",
        file="src/millstream/metastore/rollback.py",
        what="rollback: after an unknown outcome, landed = new epoch + segments removed",
        old="""\
        if shard is None or shard.epoch < plan.new_epoch:
""",
        new="""\
        if shard is None or shard.epoch < plan.new_epoch or shard.upper != plan.new_upper:
""",
        tests=(
            _guard_test(
                "test_a_rollback_that_landed_is_reported_landed_even_if_a_writer_committed_since"
            ),
        ),
    ),
    Guard(
        name="gc-lists-before-reading-references",
        file="src/millstream/table/gc.py",
        what="collect_garbage: files are listed before the references are read",
        old="""\
    files = deep.list_files(table_data_prefix(table))
    referenced = store.referenced_files(table)
""",
        new="""\
    referenced = store.referenced_files(table)  # MUTATION: references read first
    files = deep.list_files(table_data_prefix(table))
""",
        tests=(
            _guard_test(
                "test_gc_lists_files_before_reading_references_so_a_commit_in_between_keeps_its_file"
            ),
        ),
    ),
    Guard(
        name="gc-cutoff-before-references",
        file="src/millstream/table/gc.py",
        what="collect_garbage: the grace period's cutoff is taken before the references are read",
        old="""\
    cutoff = clock.now() - grace_seconds
    # List files before reading references: a file committed in between is then referenced.
    files = deep.list_files(table_data_prefix(table))
    referenced = store.referenced_files(table)
""",
        new="""\
    files = deep.list_files(table_data_prefix(table))
    referenced = store.referenced_files(table)
    cutoff = clock.now() - grace_seconds  # MUTATION: the cutoff taken after the references
""",
        tests=(
            _guard_test(
                "test_gc_takes_its_cutoff_before_reading_references_so_a_stalled_pass_keeps_a_file_committed_meanwhile"
            ),
        ),
    ),
    Guard(
        name="commit-refuses-expired-staged-file",
        file="src/millstream/table/commit.py",
        what="commit_writes: a file staged longer ago than GC's grace allows is refused",
        old="""\
                raise StagedFileExpiredError(sorted(w.paths)[0], now - w.staged_at, max_staged_age)
""",
        new="""\
                pass  # MUTATION: an expired staged file is committed
""",
        tests=(
            _guard_test("test_a_commit_refuses_a_staged_file_older_than_gc_could_have_deleted"),
        ),
    ),
    Guard(
        name="commit-checks-age-inside-transaction",
        file="src/millstream/table/commit.py",
        what="commit_writes: the staged-file age is checked right before COMMIT, not up front",
        old="""\
            changes, writer_id=writer_id, batch_id=batch_id, precondition=young_enough
        )""",
        new="""\
            changes, writer_id=writer_id, batch_id=batch_id, precondition=young_enough()
        )  # MUTATION: checked once, up front""",
        tests=(
            _guard_test(
                "test_a_commit_that_waits_inside_its_transaction_past_the_limit_is_refused"
            ),
        ),
    ),
    Guard(
        name="commit-raises-dead-letter-gaps",
        file="src/millstream/table/commit.py",
        what="BatchCommit.raise_for_gaps: a gap in the dead-letter table raises like one in the table",
        old="""\
            self.dead_letter.raise_for_gaps(list(self.dead_letter_appends))
""",
        new="""\
            pass  # MUTATION: dead-letter gaps are ignored
""",
        tests=(_guard_test("test_a_dead_letter_shard_behind_the_tables_is_covered_by_it"),),
        skip="moot since issue 38: a dead-letter shard decides against its table's upper "
        "(guard 421), so it gaps only where its table gaps, and the table's gap raises first",
    ),
    Guard(
        name="ensure-shards-start-together",
        file="src/millstream/metastore/shards.py",
        what="ensure_shards: a missing shard starts at the lowest upper its siblings have",
        old="""\
        upper = min(existing) if existing else start
""",
        new="""\
        upper = start  # MUTATION: a missing shard starts at the source's position
""",
        tests=("tests/unit/ingest/test_bootstrap_dead_letter.py",),
    ),
    Guard(
        name="bootstrap-starts-at-table-upper",
        file="src/millstream/spark/runner.py",
        what="bootstrap: a writer starts at the table's upper, which covers a lagging "
        "dead-letter shard (issue 38; it started at the lower of the two)",
        old="""\
        uppers={p: sh.upper for p, sh in shards.items()},
""",
        new="""\
        uppers={p: min(sh.upper, dl[p].upper) if p in dl else sh.upper for p, sh in shards.items()},  # MUTATION: the lower upper
""",
        tests=(
            "tests/unit/ingest/test_bootstrap_dead_letter.py::"
            "test_a_writer_starts_at_the_tables_shard_when_the_dead_letter_shard_lags",
            "tests/contract/test_dead_letters_only_with_bad_records.py",
        ),
        select="sqlite-local or lags",
    ),
    Guard(
        name="lease-fence-locks-row",
        file="src/millstream/metastore/leases.py",
        what="check_fence: the lease row is read FOR UPDATE (held until the fenced write ends)",
        old="""\
    cur = read_lease(conn, name, lock=True)
""",
        new="""\
    cur = read_lease(conn, name, lock=False)  # MUTATION: a plain SELECT
""",
        tests=("tests/scenarios/test_lease_fence_on_postgres.py",),
    ),
    Guard(
        name="cas-checks-rowcount",
        file="src/millstream/metastore/cas.py",
        what="cas_update: an update that matched no row (the version moved) raises",
        old="""\
    if conn.execute(stmt).rowcount != 1:
""",
        new="""\
    if conn.execute(stmt) is None:  # MUTATION: the rowcount is not checked
""",
        tests=(
            "tests/contract/test_contract_concurrency.py::"
            "test_two_compare_and_sets_on_the_same_row_version_exactly_one_conflicts[sqlite-local]",
        ),
    ),
    Guard(
        name="frontier-fences-stale-epoch",
        file="src/millstream/core/frontier.py",
        what="decide: a writer at a stale epoch is FENCED",
        old="""\
    if writer_epoch != epoch:
        return Decision(Outcome.FENCED, upper, upper, upper)
""",
        new="""\
    if writer_epoch != epoch:
        pass  # MUTATION: a stale epoch is decided like a current one
""",
        tests=(
            "tests/scenarios/test_seed_004_lagging_writer_below_upper.py",
            "tests/contract/test_contract_append.py",
        ),
        select="seed_004 or sqlite-local",
    ),
    Guard(
        name="frontier-drops-below-upper",
        file="src/millstream/core/frontier.py",
        what="decide: a batch entirely below the upper is dropped, not committed again",
        old="""\
        return Decision(Outcome.DROP, upper, upper, upper, empty=lo == hi)
""",
        new="""\
        return Decision(Outcome.COMMIT, lo, hi, upper, empty=lo == hi)  # MUTATION
""",
        tests=(
            "tests/scenarios/test_seed_004_lagging_writer_below_upper.py",
            "tests/contract/test_contract_append.py",
        ),
        select="seed_004 or sqlite-local",
    ),
    Guard(
        name="supervisor-survives-step-error",
        file="src/millstream/supervise.py",
        what="Supervisor.attempt: a step's exception is recorded and backed off, not raised",
        old="""\
            self._failed(exc)
            return False
""",
        new="""\
            self._failed(exc)
            raise  # MUTATION: the step's error ends the loop
""",
        tests=(
            "tests/unit/test_supervise.py",
            "tests/unit/ingest/test_runner_background_sealing.py",
        ),
    ),
    Guard(
        name="delete-takes-effective-comparison-value",
        file="src/millstream/core/merge.py",
        what="a delete without a comparison value takes the highest value its key has at "
        "lower offsets of its partition",
        old="""\
    return pc.if_else(need, earlier, values)
""",
        new="""\
    return values  # MUTATION: a delete without a comparison value keeps none
""",
        tests=(
            "tests/unit/core/test_merge_engines_property.py::"
            "test_upsert_a_tombstone_removes_the_rows_up_to_the_highest_earlier_comparison_value",
            "tests/scenarios/test_deletes_recreate_keys.py",
        ),
    ),
    Guard(
        name="expiry-deletes-only-rows-no-kept-version-sees",
        file="src/millstream/metastore/expiry.py",
        what="expire_versions: deletes only rows removed at or before the new floor",
        old="    return removed_version is not None and removed_version <= floor\n",
        new="    return True\n",
        tests=(
            "tests/contract/test_contract_retention.py::test_gc_after_expiry_deletes_exactly_"
            "the_files_no_kept_version_references[sqlite-local]",
        ),
    ),
    Guard(
        name="expiry-keeps-min-versions",
        file="src/millstream/metastore/expiry.py",
        what="expiry_floor: the newest min_versions versions are kept however old",
        old="    return max(0, min(int(at_window_start), current - min_versions + 1))\n",
        new="    return max(0, int(at_window_start))\n",
        tests=(
            "tests/contract/test_contract_retention.py::test_min_versions_keeps_history_however_"
            "old[sqlite-local]",
        ),
    ),
    Guard(
        name="seal-swap-refuses-expired-claim",
        file=SWAPS,
        what="replace_run: a seal whose claim expired before its swap is discarded (GC may "
        "have deleted its upload)",
        old="""\
        if not all(e.claim_held(at) for e in entries):
""",
        new="""\
        if False:  # MUTATION: an expired claim still swaps
""",
        tests=(
            _guard_test(
                "test_a_sealer_stalled_past_its_claim_swaps_nothing_even_if_nobody_took_the_"
                "run_over"
            ),
            "tests/unit/sealing/test_claim_clock_skew.py::"
            "test_a_swap_after_the_claim_expired_is_refused_whatever_the_sealers_clock",
        ),
    ),
    Guard(
        name="reingest-refuses-old-file",
        file="src/millstream/sealing/reingest.py",
        what="reingest_segment: a rebuilt file older than the staged-file limit is not swapped in",
        old="""\
    if age > max_staged_age:
""",
        new="""\
    if False:  # MUTATION: however old the rebuilt file
""",
        tests=(
            _guard_test(
                "test_a_reingestion_refuses_a_rebuilt_file_older_than_gc_could_have_deleted"
            ),
        ),
    ),
    Guard(
        name="reingest-file-age-checked-right-before-commit",
        file="src/millstream/sealing/reingest.py",
        what="reingest_segment: the rebuilt file's age is checked again inside the swap's "
        "transaction, right before COMMIT: a stall between the first check and the swap longer "
        "than GC's grace would swap in a file GC has deleted",
        old="""\
            precondition=young_enough,
""",
        new="""\
            precondition=None,  # MUTATION: judged by the check before the transaction only
""",
        tests=(
            _guard_test(
                "test_a_reingestion_stalled_before_its_swap_lands_nothing_once_its_file_is_too_old"
            ),
        ),
    ),
    Guard(
        name="seal-missing-file-of-a-replaced-segment-is-a-change",
        file="src/millstream/sealing/sealer.py",
        what="Sealer._read_of_a_stale_manifest: a file missing from a seal's or compaction's "
        "read that the current manifest no longer names (re-ingested and collected meanwhile) "
        "is SegmentChangedError, retried from the current manifest, not a segment reported "
        "unavailable",
        old="""\
        if path is None or path in live:
""",
        new="""\
        if True:  # MUTATION: every missing file reported unavailable
""",
        tests=(
            _guard_test(
                "test_a_compaction_whose_segment_was_re_ingested_and_collected_meanwhile_is_retried"
            ),
        ),
    ),
    # The commit-path campaign, alone, catches these three (issue: "the campaign proves it can
    # fail"); each also has its own scenario or unit test above or in its module.
    Guard(
        name="campaign-frontier-drops-below-upper",
        file="src/millstream/core/frontier.py",
        what="decide: a batch entirely below the upper is dropped (caught by the campaign)",
        old="""\
        return Decision(Outcome.DROP, upper, upper, upper, empty=lo == hi)
""",
        new="""\
        return Decision(Outcome.COMMIT, lo, hi, upper, empty=lo == hi)  # MUTATION
""",
        tests=(COMMIT_CAMPAIGN,),
    ),
    Guard(
        name="campaign-lifecycle-completes-conditionally",
        file="src/millstream/control/registry.py",
        what="Registry.complete applies only if the state is still the expected one",
        old="""\
            if rec is None or rec.state is not expected:
                return False
""",
        new="""\
            if rec is None:  # MUTATION: a late completion applies to whatever state it finds
                return False
""",
        tests=(COMMIT_CAMPAIGN,),
    ),
    Guard(
        name="campaign-sealer-claims-in-order",
        file=CLAIMS,
        what="claim_run leaves a run alone while a segment of it is claimed (in order)",
        old="""\
        if cur.claim_held(now):
            return None
        checked[e.id] = cur.row_version
    # The versions the check saw, in one compare-and-set of the run: a claim committed since
""",
        new="""\
        if cur.claim_held(now):
            continue  # MUTATION: a claimed segment is skipped, the newer ones claimed
        checked[e.id] = cur.row_version
    if not checked:
        return None
    # The versions the check saw, in one compare-and-set of the run: a claim committed since
""",
        tests=(COMMIT_CAMPAIGN,),
    ),
    Guard(
        name="controller-tick-survives-store-outage",
        file="src/millstream/control/controller.py",
        what="Controller.run_forever: a tick the metadata store failed runs again next time",
        old="""\
            except (MillstreamError, *STORE_ERRORS) as exc:
""",
        new="""\
            except MillstreamError as exc:  # MUTATION: a dropped connection ends the loop
""",
        tests=(
            "tests/unit/api/test_api_store_outage.py::test_the_controller_loop_outlives_a_store_"
            "outage_and_goes_on_once_it_is_back",
        ),
    ),
    Guard(
        name="read-drops-rows-outside-entries",
        file="src/millstream/table/read.py",
        what="read_entries keeps a file's rows only inside its entries' ranges (the shortcut "
        "that skips the filter checks every partition's offsets first)",
        old="""\
        if bounds is None or span["min"] < bounds[0] or span["max"] >= bounds[1]:
            return False
""",
        new="""\
        if bounds is None:  # MUTATION: rows outside the entry's range pass the shortcut
            return False
""",
        tests=(
            "tests/scenarios/test_seed_004_lagging_writer_below_upper.py::test_seed_004_"
            "materialize_36860_batch_straddling_upper_is_trimmed_to_upper",
        ),
    ),
    Guard(
        name="upsert-last-position-wins",
        file="src/millstream/core/engines/upsert.py",
        what="the hash path of an upsert read keeps each key's row at the highest position",
        old="""\
        return by_position(self.spec, rows, "max")
""",
        new="""\
        return by_position(self.spec, rows, "min")  # MUTATION: the first row wins
""",
        tests=(
            "tests/unit/core/test_merge_engines_property.py::test_upsert_orders_by_partition_"
            "then_offset_and_sorts_its_rows_by_key_at_any_offset",
        ),
    ),
    Guard(
        name="dedup-first-position-wins",
        file="src/millstream/core/engines/dedup.py",
        what="the hash path of a dedup read keeps each key's row at the lowest position",
        old="""\
            return by_position(spec, rows, "min")
""",
        new="""\
            return by_position(spec, rows, "max")  # MUTATION: the last row wins
""",
        tests=(
            "tests/unit/core/test_merge_engines_property.py::test_dedup_first_row_of_a_key_wins",
        ),
    ),
    Guard(
        name="only-an-upsert-by-position-reads-sealed-rows-as-final",
        file="src/millstream/core/engines/upsert.py",
        what="a partition's sealed rows are read as already merged (one row per key, newer rows "
        "win) only for an upsert table without a comparison column",
        old="""\
        return self.spec.comparison_column is None
""",
        new="""\
        return True  # MUTATION: ordered by a comparison column too
""",
        tests=(
            "tests/unit/sealing/test_delete_vectors.py::test_random_ingest_and_seals_read_equal_to_the_"
            "model_with_and_without_delete_vectors",
        ),
        select="upsert_cmp",
    ),
    Guard(
        name="dedup-by-comparison-keeps-no-key-index",
        file="src/millstream/core/engines/dedup.py",
        what="a dedup table ordered by a comparison column writes no delete vectors (a run's "
        "delete may order before the sealed rows of its key)",
        old="""\
        return self.spec.comparison_column is None
""",
        new="""\
        return True  # MUTATION: index (and delete) by offset order
""",
        tests=(
            "tests/unit/sealing/test_delete_vectors.py::test_random_ingest_and_seals_read_equal_to_the_"
            "model_with_and_without_delete_vectors",
        ),
        select="dedup_cmp",
    ),
    Guard(
        name="partial-by-comparison-keeps-no-key-index",
        file="src/millstream/core/engines/partial.py",
        what="a partial table ordered by a comparison column writes no delete vectors (a run's "
        "delete may order before the sealed rows of its key)",
        old="""\
        return self.spec.comparison_column is None
""",
        new="""\
        return True  # MUTATION: index (and delete) by offset order
""",
        tests=(
            "tests/unit/sealing/test_delete_vectors.py::test_random_ingest_and_seals_read_equal_to_the_"
            "model_with_and_without_delete_vectors",
        ),
        select="partial_cmp",
    ),
    Guard(
        name="upsert-compaction-materializes-effective-values",
        file="src/millstream/core/engines/upsert.py",
        what="an upsert table ordered by a comparison column compacts with the partition's "
        "earlier values as a floor and writes each delete's effective value",
        old="""\
        return self.spec.comparison_column is not None
""",
        new="""\
        return False  # MUTATION: no floor, deletes keep a null value
""",
        tests=(
            "tests/unit/core/test_compaction_property.py",
            "tests/unit/sealing/test_delete_vectors.py::test_random_ingest_and_seals_read_equal_to_the_"
            "model_with_and_without_delete_vectors",
        ),
        select="upsert_cmp or does_not_change_the_table",
    ),
    Guard(
        name="expiry-keeps-pinned-versions",
        file="src/millstream/metastore/expiry.py",
        what="expire_versions: the floor never passes the oldest unexpired read pin",
        old="""\
    if pinned is not None and pinned < floor:
""",
        new="""\
    if False:  # MUTATION: expiry ignores read pins
""",
        tests=(
            "tests/contract/test_contract_retention.py::test_a_pinned_version_outlives_the_"
            "window_until_its_pin_is_released[sqlite-local]",
        ),
    ),
    Guard(
        name="pin-waits-for-expiry",
        file="src/millstream/metastore/pins.py",
        what="pin_version takes the table row's lock, so it cannot pin a version an "
        "uncommitted expiry is deleting",
        old="""\
    info = find_table(conn, table, for_update=True)
""",
        new="""\
    info = find_table(conn, table)  # MUTATION: no lock against a concurrent expiry
""",
        tests=(
            "tests/contract/test_contract_retention.py::test_a_pin_racing_an_expiry_either_"
            "keeps_its_version_or_is_refused[postgres-local]",
        ),
    ),
    Guard(
        name="pushdown-only-key-columns",
        file="src/millstream/spark/table_source.py",
        what="the Spark source applies a filter before the merge of a keyed table only if it "
        "is on a key column",
        old="""\
    if spec.keyed and column not in spec.primary_key:
        return None  # it could drop a key's newest row and bring back an older one
""",
        new="",
        tests=(
            "tests/unit/test_table_source_pushdown.py::test_key_filters_are_applied_before_the_"
            "merge_and_others_are_left_to_spark",
        ),
    ),
    Guard(
        name="expired-version-read-refused",
        file="src/millstream/metastore/reads.py",
        what="resolve_version: a version below the oldest kept one raises VersionExpiredError",
        old="""\
        if as_of < oldest:
            raise VersionExpiredError(info.name, as_of, oldest)
""",
        new="",
        tests=(
            "tests/contract/test_contract_retention.py::test_expiry_keeps_the_window_and_min_"
            "versions_and_refuses_reads_below_it[sqlite-local]",
        ),
    ),
    Guard(
        name="compaction-needs-unchanged-sealed-state",
        file=SWAPS,
        what="replace_sealed lands only if the partition's sealed entries and delete vectors "
        "are the ones the compaction planned from",
        old="""\
        if sealed_state(conn, table, partition) != reflects:
            raise SegmentChangedError(
                f"the sealed segments of {table} partition {partition} changed while they "
""",
        new="""\
        if False:  # MUTATION: a seal, rollback or re-ingestion since the plan goes unnoticed
            raise SegmentChangedError(
                f"the sealed segments of {table} partition {partition} changed while they "
""",
        tests=(
            "tests/unit/sealing/test_compaction.py::test_a_seal_landing_during_a_compaction_"
            "discards_the_compaction",
            "tests/contract/test_contract_compaction.py::test_a_seal_and_a_compaction_racing_"
            "in_real_transactions_never_both_land[postgres-local-seal]",
        ),
    ),
    Guard(
        name="seal-deadline",
        file=SWAPS,
        what="replace_run refuses a seal's swap that lands more than a claim's TTL after its "
        "upload began (the renewed claim does not bound the file's age; GC may have collected it)",
        old="""\
        if deadline is not None and (sealer_clock or clock).now() >= deadline:
""",
        new="""\
        if False:  # MUTATION: a seal stalled after its upload swaps in a possibly collected file
""",
        tests=(
            "tests/unit/sealing/test_claim_renewal.py::test_a_seal_stalled_past_a_claims_ttl_"
            "between_its_upload_and_swap_is_refused",
        ),
    ),
    Guard(
        name="compaction-deadline",
        file=SWAPS,
        what="replace_sealed refuses a swap that lands after the compaction's deadline (its "
        "merged file may be older than GC's grace period)",
        old="""\
        if clock.now() >= deadline:
""",
        new="""\
        if False:  # MUTATION: a stalled compactor swaps in a possibly collected file
""",
        tests=(
            "tests/unit/sealing/test_compaction.py::test_a_compaction_that_stalls_past_its_"
            "deadline_is_refused",
        ),
    ),
    Guard(
        name="compaction-window-is-a-suffix",
        file="src/millstream/sealing/compaction.py",
        what="a compaction window ends at the newest sealed segment, so every delete vector it "
        "applies comes from a seal inside it (a rollback removes both or neither)",
        old="""\
    window = sealed[i:]
""",
        new="""\
    window = sealed[i : len(sealed) - 1] if len(sealed) - i > 2 else sealed[i:]  # MUTATION
""",
        tests=(
            "tests/unit/sealing/test_compaction.py::test_a_rollback_after_compaction_brings_"
            "back_what_it_should",
        ),
    ),
    Guard(
        name="unmerged-read-drops-superseded-sealed-rows",
        file="src/millstream/table/read.py",
        what="a partitioned_by_key read that keeps a partition's sealed rows unmerged drops "
        "those of keys with newer (unsealed) rows",
        old="""\
            kept = final.filter(pc.invert(found))  # newer keys hold no null (callers check)
""",
        new="""\
            kept = final  # MUTATION: a key's sealed row stays beside its newer rows
""",
        tests=(
            "tests/unit/sealing/test_compaction.py::test_a_partitioned_by_key_read_skips_the_"
            "merge_only_where_sealed_rows_are_final",
        ),
    ),
    Guard(
        name="unmerged-read-drops-superseded-sealed-rows-of-a-composite-key",
        file="src/millstream/table/read.py",
        what="the same, for a key of several columns (a hash anti-join)",
        old="""\
            kept = final.join(newer_keys, keys=keys, join_type="left anti", use_threads=False)
""",
        new="""\
            kept = final  # MUTATION: a key's sealed row stays beside its newer rows
""",
        tests=(
            "tests/unit/sealing/test_compaction.py::test_a_two_column_key_partitioned_by_key_"
            "read_drops_sealed_rows_newer_rows_supersede",
        ),
    ),
    Guard(
        name="unmerged-read-needs-every-vector",
        file="src/millstream/table/read.py",
        what="a partitioned_by_key read merges a partition whose delete vector it could not "
        "read (its superseded rows are back)",
        old="""\
        if split is not None and not unreadable:
""",
        new="""\
        if split is not None:  # MUTATION: an unread vector's rows pass
""",
        tests=(
            "tests/unit/sealing/test_compaction.py::test_a_partitioned_by_key_read_skips_the_"
            "merge_only_where_sealed_rows_are_final",
        ),
    ),
    Guard(
        name="read-cache-keeps-only-whole-sealed-rows",
        file="src/millstream/table/read.py",
        what="a reader's cache never keeps a partition's sealed rows read without one of its "
        "delete vectors (the next read would take them as final)",
        old="""\
        if cache is not None and key is not None and not unreadable:
""",
        new="""\
        if cache is not None and key is not None:  # MUTATION: kept without a vector
""",
        tests=(
            "tests/unit/sealing/test_compaction.py::test_a_reader_cache_never_keeps_sealed_rows_"
            "read_without_their_delete_vector",
        ),
    ),
    Guard(
        name="incremental-read-needs-the-same-first-entries",
        file="src/millstream/table/read.py",
        what="a cached reader merges onto its previous read only when that read's newer "
        "entries are the first of this one's (a rollback or re-ingest replaced them otherwise)",
        old="""\
            if tag[: len(prev_tag)] == prev_tag:
""",
        new="""\
            if len(prev_tag) <= len(tag):  # MUTATION: any earlier read is a base
""",
        tests=(
            "tests/unit/sealing/test_compaction.py::test_a_cached_reader_does_not_merge_onto_"
            "a_read_a_rollback_replaced",
            "tests/unit/sealing/test_compaction.py::test_a_cached_reader_does_not_keep_a_read_"
            "a_reingest_replaced",
            "tests/unit/sealing/test_compaction.py::test_a_polling_cached_reader_equals_the_"
            "model_through_seals_compactions_and_rollbacks",
        ),
    ),
    Guard(
        name="reingest-checks-source-range",
        file="src/millstream/sealing/reingest.py",
        what="reingest_segment: a range the source no longer holds (retention, deleted files) "
        "is refused, not rebuilt with rows missing",
        old="""\
    check_source_range(reader, entry)
    batches = list(reader.read_range(entry.partition, entry.start, entry.end))
    check_source_range(reader, entry)  # retention may have moved past the start meanwhile
""",
        new="""\
    batches = list(reader.read_range(entry.partition, entry.start, entry.end))  # MUTATION
""",
        tests=(
            "tests/unit/api/test_api_auto_repair.py::test_a_segment_whose_source_is_gone_is_"
            "unrecoverable_with_its_reason_and_not_retried_in_a_loop",
        ),
    ),
    Guard(
        name="reingest-job-one-active-per-segment",
        file="src/millstream/metastore/schema.py",
        what="ms_controller_jobs.active_key is unique: two controllers never both run a "
        "re-ingest job for the same segment",
        old="""\
Index("ux_controller_jobs_active", controller_jobs.c.active_key, unique=True)
""",
        new="""\
Index("ux_controller_jobs_active", controller_jobs.c.active_key)  # MUTATION: not unique
""",
        tests=(
            "tests/contract/test_postgres_reingest_jobs.py::test_two_controllers_starting_the_"
            "same_segments_job_at_once_run_it_once_on_postgres",
        ),
    ),
    Guard(
        name="decode-decimal-overflow-dead-letters",
        file="src/millstream/ingest/formats/fit.py",
        what="a decoded decimal with more integer digits than its precision dead-letters its "
        "record naming the column (Arrow's JSON reader builds it, and Parquet would store it)",
        old="""\
    if has_decimal(target):
        return _no_overflow(fitted, errors, name)
""",
        new="""\
    if False:  # MUTATION: no overflow check
        return _no_overflow(fitted, errors, name)
""",
        tests=(
            "tests/unit/ingest/test_nested_decode.py::test_json_nested_and_decimal_values_"
            "decode_and_bad_ones_are_dead_lettered_naming_the_column",
        ),
    ),
    Guard(
        name="stage-refuses-decimal-overflow",
        file="src/millstream/table/writer.py",
        what="stage_rows refuses rows holding a decimal that overflows its column's precision",
        old="""\
    _refuse_decimal_overflow(spec, rows)
""",
        new="""\
    pass  # MUTATION: overflowing decimals are staged
""",
        tests=(
            "tests/unit/core/test_nested_types_engines.py::test_staging_a_decimal_that_"
            "overflows_its_precision_is_refused",
        ),
    ),
    Guard(
        name="schema-evolution-cas",
        file="src/millstream/metastore/tables.py",
        what="evolve_table: the table row changes by compare-and-set on the version its check "
        "read, so a concurrent update is re-checked against the winner (not overwritten)",
        old="""\
    row_version = cas_update(
        conn,
        s.tables,
        {"name": spec.name},
        existing.version,
        {"spec": spec.to_json_dict(), "schema_version": schema_version},
    )
""",
        new="""\
    conn.execute(  # MUTATION: no version condition, no rowcount check
        s.tables.update()
        .where(s.tables.c.name == spec.name)
        .values(spec=spec.to_json_dict(), schema_version=schema_version)
    )
    row_version = existing.version + 1
""",
        tests=(
            "tests/contract/test_contract_schema_evolution.py::test_a_retention_change_racing_a_"
            "schema_change_on_postgres_cannot_drop_the_new_column",
        ),
    ),
    Guard(
        name="schema-evolution-compatibility-check",
        file="src/millstream/metastore/tables.py",
        what="evolve_table: a change that rows already written could not follow (a column "
        "removed, a type narrowed) is refused before anything is written",
        old="""\
    changes = check_evolution(existing.spec, spec)
    if not changes:
        return existing, []
""",
        new="""\
    try:  # MUTATION: any change is applied
        changes = check_evolution(existing.spec, spec)
    except Exception:
        changes = [Change("widen", None, None, None)]
    if not changes:
        return existing, []
""",
        tests=(
            "tests/contract/test_contract_schema_evolution.py::test_an_incompatible_change_is_"
            "refused_and_nothing_changes[sqlite-local]",
            "tests/unit/api/test_api_datastream_update.py",
        ),
    ),
    Guard(
        name="writer-decodes-under-current-schema",
        file="src/millstream/spark/sink.py",
        what="SegmentSink.write decodes under the table's current spec, so records carrying a "
        "column added while the writer runs keep it",
        old="""\
        spec = (current or self.current_spec()) if ranges else self.spec
""",
        new="""\
        spec = self.spec  # MUTATION: the spec the query started with
""",
        tests=("tests/unit/ingest/test_writer_schema_pickup.py",),
    ),
    Guard(
        name="a-shared-querys-member-decodes-under-its-own-spec",
        file="src/millstream/spark/sink.py",
        what="a shared query's write task reads its members' specs in one read and each member "
        "decodes and stages under its own table's spec (guard 310)",
        old="""\
                    iter(parts[name].to_batches()), batch_id, current=current.get(sink.spec.name)
""",
        new="""\
                    iter(parts[name].to_batches()),
                    batch_id,
                    current=next(iter(current.values()), None),  # MUTATION: any member's spec
""",
        tests=(
            "tests/unit/ingest/test_shared_query_membership.py::test_a_task_of_many_busy_tables_"
            "reads_their_specs_at_once_and_each_decodes_under_its_own",
        ),
    ),
    Guard(
        name="read-cache-keyed-by-schema",
        file="src/millstream/table/read.py",
        what="a reader's cache keys a file's rows by the schema they were conformed to, so rows "
        "cached before a schema change are not handed back without its new columns",
        old="""\
    shape = schema_key(schema)
""",
        new="""\
    shape = None  # MUTATION: rows cached under any schema are reused
""",
        tests=(
            "tests/unit/sealing/test_schema_evolution_reads.py::test_old_segments_read_with_"
            "nulls_for_added_columns_and_widened_types",
        ),
    ),
    Guard(
        name="auto-refuses-incompatible-writer-schema",
        file="src/millstream/ingest/formats/absorb.py",
        what="schema_evolution auto: a writer schema the evolution rules refuse (string -> long, "
        "long -> double) leaves the table as it is and its records that do not fit are "
        "dead-lettered naming the field, the frontier advancing (not a batch that fails on "
        "every retry)",
        old="""\
    check_evolution(spec, grown)
    return grown
""",
        new="""\
    return grown  # MUTATION: the rules are not asked before evolving
""",
        tests=(f"{AUTO}::test_auto_does_not_evolve_on_a_writer_schema_the_rules_refuse",),
    ),
    Guard(
        name="auto-evolves-through-the-cas-path",
        file="src/millstream/metastore/evolve.py",
        what="schema_evolution auto changes the table through evolve_table (rules, compare-and-"
        "set on the table row, schema version + 1 with its history row), as a manual update does",
        old="""\
    info, changes = evolve_with_dead_letter(conn, clock, wanted)
""",
        new="""\
    conn.execute(  # MUTATION: the spec written straight into the row
        s.tables.update().where(s.tables.c.name == table).values(spec=wanted.to_json_dict())
    )
    info, changes = existing, [Change("add", None, None, None)]
""",
        tests=(
            f"{AUTO}::test_auto_grows_the_table_at_the_batch_that_first_carries_a_new_writer_schema",
            f"{AUTO}::test_two_tasks_racing_to_absorb_the_same_writer_schema_evolve_the_table_once",
        ),
    ),
    Guard(
        name="auto-decodes-under-the-evolved-spec",
        file="src/millstream/spark/sink.py",
        what="schema_evolution auto: the records of the piece that carries a new writer schema "
        "are decoded under the grown spec, so none loses the new field's value",
        old="""\
                    spec = self._absorb(partial(auto.absorbing, values=values))
""",
        new="""\
                    self._absorb(partial(auto.absorbing, values=values))  # MUTATION: old spec
""",
        tests=(
            f"{AUTO}::test_auto_grows_the_table_at_the_batch_that_first_carries_a_new_writer_schema",
        ),
    ),
    Guard(
        name="debezium-delete-uses-befores-key",
        file="src/millstream/ingest/formats/envelope.py",
        what="a Debezium op d (JSON or Avro) deletes before's key, never after's (an event "
        "that carries an after of another row must not delete that row)",
        old="""\
        columns[c] = pc.if_else(is_delete, key, value)
""",
        new="""\
        columns[c] = pc.if_else(pc.is_null(value), key, value)  # MUTATION: after's key first
""",
        tests=(
            "tests/unit/ingest/test_debezium.py::test_a_delete_takes_befores_key_never_afters_"
            "nor_the_record_key",
            "tests/unit/ingest/test_debezium_avro.py::test_a_delete_takes_befores_key_never_"
            "afters_nor_the_record_key",
        ),
    ),
    Guard(
        name="debezium-avro-tombstone-reads-its-avro-key",
        file="src/millstream/ingest/formats/envelope.py",
        what="the tombstone after a Debezium Avro delete deletes the key its Avro record key "
        "holds (read through the registry), not whatever the JSON rules make of Avro bytes",
        old="""\
        reader = getattr(self.inner, "record_key", None)
""",
        new="""\
        reader = None  # MUTATION: record keys are read by the JSON rules only
""",
        tests=(
            "tests/unit/ingest/test_debezium_avro.py::test_avro_events_decode_like_their_json_"
            "twins_and_the_model",
        ),
    ),
    Guard(
        name="protobuf-tombstone-reads-its-protobuf-key",
        file="src/millstream/ingest/decode.py",
        what="a tombstone of a Protobuf source deletes the key its Protobuf record key holds "
        "(read by the key's own writer schema through the registry), not whatever the JSON "
        "rules make of the wire bytes",
        old="""\
    if key is not None and isinstance(fmt, (EnvelopeDecoder, SchemaDecoder)):
""",
        new="""\
    if key is not None and isinstance(fmt, EnvelopeDecoder):  # MUTATION: JSON rules only
""",
        tests=(
            f"{PROTO_TABLES}::test_a_protobuf_topics_table_is_made_from_its_writer_schemas_and_"
            "grows_with_them",
        ),
    ),
    Guard(
        name="a-protobuf-key-its-schema-cannot-read-deletes-nothing",
        file="src/millstream/ingest/formats/__init__.py",
        what="a Protobuf record key its writer schema does not read (cut inside a field) makes "
        "its tombstone a dead letter naming why, never a delete of what the JSON rules make of "
        "its bytes (for a string key, another key)",
        old="""\
        if parsed.bad or parsed.table.num_rows != 1:
            why = next(iter(parsed.bad.values()), "not read")
            raise ValueError(f"the Protobuf key (schema id {schema_id}) is bad: {why}")
""",
        new="""\
        if parsed.bad or parsed.table.num_rows != 1:  # MUTATION: the JSON rules take over
            return None  # type: ignore[return-value]
""",
        tests=(
            f"{PROTO_TABLES}::test_a_tombstone_whose_protobuf_key_cannot_be_read_is_dead_lettered",
        ),
        select="string-key",
    ),
    Guard(
        name="a-text-key-is-no-wire-key",
        file="src/millstream/ingest/formats/__init__.py",
        what="only a record key that starts with the wire format's magic byte is read as a "
        "key in the wire format: a text key of a Protobuf source deletes by the JSON rules, "
        "never dead-lettered as a key of an unknown schema id",
        old="""\
        if self.registry is None or len(key) < HEADER or key[0] != 0:
""",
        new="""\
        if self.registry is None or len(key) < HEADER:  # MUTATION: no magic byte check
""",
        tests=(
            f"{PROTO_TABLES}::test_a_tombstone_whose_protobuf_key_cannot_be_read_is_dead_lettered",
        ),
        select="string-key",
    ),
    Guard(
        name="registry-error-never-dead-letters-a-key",
        file="src/millstream/ingest/decode.py",
        what="a registry that does not answer while a record key's schema is looked up fails "
        "the batch (it is retried), never dead-letters the tombstone",
        old="""\
        except ValueError as exc:
            raise _BadKey(str(exc)) from None
""",
        new="""\
        except Exception as exc:  # MUTATION: a registry error makes the key bad
            raise _BadKey(str(exc)) from None
""",
        tests=(
            "tests/unit/ingest/test_debezium_avro.py::test_a_tombstone_key_is_never_dead_"
            "lettered_while_the_registry_is_down",
        ),
    ),
    Guard(
        name="registry-down-waits-not-dead-letters",
        file="src/millstream/ingest/formats/registry.py",
        what="a registry answering 5xx is retried with backoff (the batch waits, then fails), "
        "never taken for an unknown schema id (which dead-letters and moves the frontier)",
        old="""\
                if exc.code == 404:
                    raise SchemaNotFound() from None
""",
        new="""\
                if exc.code == 404 or exc.code >= 500:  # MUTATION: down = unknown id
                    raise SchemaNotFound() from None
""",
        tests=(
            "tests/unit/ingest/test_formats.py::test_a_registry_that_is_down_makes_the_batch_"
            "wait_and_loses_nothing",
            "tests/unit/ingest/test_debezium_avro.py::test_a_new_value_schema_waits_for_a_"
            "registry_that_is_down",
        ),
    ),
    Guard(
        name="postgres-connect-times-out",
        file="src/millstream/metastore/engine.py",
        what="a new PostgreSQL connection gives up after CONNECT_TIMEOUT_SECONDS (a server "
        "that accepts and never answers does not hang a heartbeat, a REST call or a commit)",
        old="""\
            url, pool_pre_ping=True, pool_size=4, max_overflow=4, connect_args=connect_args
""",
        new="""\
            url, pool_pre_ping=True, pool_size=4, max_overflow=4  # MUTATION: no timeout
""",
        tests=("tests/unit/metastore/test_engine_connect_timeout.py",),
    ),
    Guard(
        name="cas-many-checks-rowcount",
        file="src/millstream/metastore/cas.py",
        what="cas_update_many (a commit's shard compare-and-sets in one statement): unless "
        "every row matched at the version it was read at, it raises and nothing is committed",
        old="""\
    if matched != len(rows):
""",
        new="""\
    if matched < 0:  # MUTATION: the rowcount is not checked
""",
        tests=(
            "tests/unit/metastore/test_commit_many_partitions.py::"
            "test_cas_update_many_moves_every_row_or_none",
            "tests/contract/test_postgres_manifest_races.py::"
            "test_two_sealers_claiming_the_same_run_at_once_get_it_once_on_postgres",
        ),
    ),
    Guard(
        name="footer-proves-rows-in-entry-range",
        file="src/millstream/table/footer.py",
        what="a sealed file is read without its offsets only if its footer's offsets lie in "
        "its entry's range (rows outside it are masked)",
        old="""\
    if lo < entry.start or hi >= entry.end:
        return False
""",
        new="""\
    if False:  # MUTATION: rows outside the entry's range pass
        return False
""",
        tests=(
            f"{FOOTERS_TEST}::test_a_sealed_file_with_rows_below_its_entrys_start_still_shows_"
            "only_the_entrys_rows",
        ),
    ),
    Guard(
        name="footer-proves-one-partition",
        file="src/millstream/table/footer.py",
        what="a sealed file is read without its offsets only if its footer shows the entry's "
        "partition alone (another partition's rows in a shared file are left out)",
        old="""\
    if partitions != (entry.partition, entry.partition):
        return False
""",
        new="""\
    if False:  # MUTATION: another partition's rows pass
        return False
""",
        tests=(
            f"{FOOTERS_TEST}::test_a_sealed_entrys_file_holding_another_partitions_rows_shows_"
            "only_its_own",
        ),
    ),
    Guard(
        name="footer-proves-no-vector-row",
        file="src/millstream/table/footer.py",
        what="a sealed file is read without its offsets only if no delete-vector offset of its "
        "partition lies within its offsets (the rows a vector names are dropped)",
        old="""\
    if deleted is None or len(deleted) == 0:
        return True
""",
        new="""\
    if True:  # MUTATION: a vector's rows pass
        return True
""",
        tests=(
            f"{FOOTERS_TEST}::test_rows_a_delete_vector_names_and_tombstones_are_dropped_from_"
            "sealed_rows",
        ),
    ),
    Guard(
        name="one-row-per-key-and-partition",
        file="src/millstream/core/final.py",
        what="a sealed read of a table not partitioned by key takes a key's row in its highest "
        "partition only while no (key, partition) holds two rows (else it merges by offset)",
        old="""\
        if pc.any(pc.and_(same_key, same_partition)).as_py():
            return None
""",
        new="""\
        if False:  # MUTATION: two rows of a key in one partition, the later file's wins
            return None
""",
        tests=(
            f"{FOOTERS_TEST}::test_two_rows_of_a_key_in_one_partition_are_ordered_by_offset_"
            "not_by_file",
            "tests/unit/core/test_final_merge.py",
        ),
    ),
    Guard(
        name="distinct-keys-proven-before-skipping-the-merge",
        file="src/millstream/core/final.py",
        what="a sealed read of a table not partitioned by key returns its rows unmerged only "
        "when a sort of the key values shows every key once",
        old="""\
    return not bool(np.any(ordered[1:] == ordered[:-1]))
""",
        new="""\
    return True  # MUTATION: every key taken to be in one partition
""",
        tests=("tests/unit/core/test_final_merge.py",),
    ),
    Guard(
        name="dense-keys-proven-distinct-by-counting-their-marks",
        file="src/millstream/core/final.py",
        what="dense integer keys are taken to be distinct only when the bitmap of their span "
        "holds as many marks as there are keys",
        old="""\
        return int(np.count_nonzero(seen)) == n
""",
        new="""\
        return True  # MUTATION: a bitmap filled, never counted
""",
        tests=("tests/unit/core/test_final_merge.py",),
    ),
    Guard(
        name="a-string-key-counted-distinct-before-skipping-the-merge",
        file="src/millstream/core/final.py",
        what="a single key column that is not an integer is taken to be distinct only when its "
        "distinct values are as many as the rows",
        old="""\
        return bool(len(pc.unique(column)) == rows.num_rows)
""",
        new="""\
        return True  # MUTATION: every string key taken to be in one partition
""",
        tests=("tests/unit/core/test_final_merge.py",),
    ),
    Guard(
        name="a-composite-key-counted-distinct-before-skipping-the-merge",
        file="src/millstream/core/final.py",
        what="a key of several columns is taken to be distinct only when its groups are as "
        "many as the rows",
        old="""\
        return bool(rows.select(names).group_by(names).aggregate([]).num_rows == rows.num_rows)
""",
        new="""\
        return True  # MUTATION: every composite key taken to be in one partition
""",
        tests=("tests/unit/core/test_final_merge.py",),
    ),
    Guard(
        name="dense-key-winner-is-its-highest-position",
        file="src/millstream/core/merge.py",
        what="the array over a dense integer key's span keeps each key's row at the highest "
        "(partition, offset), whatever order the rows arrived in",
        old="""\
            np.maximum.at(best, places, packed)
""",
        new="""\
            best[places] = packed  # MUTATION: the last row to arrive wins
""",
        tests=("tests/unit/core/test_merge_dense_keys.py",),
    ),
    Guard(
        name="split-pieces-chain-their-uppers",
        file="src/millstream/metastore/append.py",
        what="a partition's range split over several write tasks is decided piece by piece, "
        "each against the upper the piece before left, and its shard moves once",
        old="""\
        upper, epoch = running.get(a.partition, start)
""",
        new="""\
        upper, epoch = start  # MUTATION: as read, not after the pieces before
""",
        tests=("tests/contract/test_contract_split_ranges.py",),
        select="sqlite-local",
    ),
    Guard(
        name="a-shared-querys-members-commit-on-their-own",
        file="src/millstream/spark/sink.py",
        what="in a shared query, a member whose commit fails (fenced, gapped) does not keep "
        "the members after it from finishing their commit (their commit log, their gaps)",
        old="""\
                    log.warning("batch %s of datastream %s did not commit: %s", batchId, name, exc)
                    errors.append(exc)
""",
        new="""\
                    raise  # MUTATION: the first failure ends the batch's commit
""",
        tests=("tests/contract/test_contract_shared_query.py",),
        select="sqlite-local",
    ),
    Guard(
        name="a-shared-query-task-holds-one-bucket-per-member",
        file="src/millstream/spark/sources.py",
        what="a shared query's task never gets two of one member's buckets (a split "
        "partition's two pieces would be reported as one range and the commit refused)",
        old="""\
        i = min((j for j in range(n) if name not in held[j]), key=lambda j: load[j])
""",
        new="""\
        i = min(range(n), key=lambda j: load[j])  # MUTATION: any task
""",
        tests=("tests/unit/ingest/test_shared_query_planning.py",),
    ),
    Guard(
        name="a-commit-never-deletes-a-referenced-file",
        file="src/millstream/table/commit.py",
        what="the staged files a commit did not reference are deleted only if the manifest "
        "does not reference them either (the same staged write committed twice)",
        old="""\
    for p in paths - referenced:
""",
        new="""\
    for p in paths:  # MUTATION: whatever the manifest references
""",
        tests=("tests/contract/test_contract_manifest_guards.py",),
        select="sqlite-local",
    ),
    Guard(
        name="available-now-jobs-restart-when-fenced",
        file="src/millstream/spark/runner.py",
        what="an available-now run (Spark jobs) whose commit is fenced or gapped starts again "
        "from the shard uppers",
        old="""\
        except RESTARTABLE as exc:
            return exc
        except Exception as exc:
            if self._stopping:  # stop() cancelled the batch's job
""",
        new="""\
        except Exception as exc:  # MUTATION: a fenced commit ends the run with its error
            if self._stopping:  # stop() cancelled the batch's job
""",
        tests=(
            "tests/integration/test_available_now_jobs.py::"
            "test_a_commit_fenced_in_the_middle_of_a_run_restarts_it_from_the_shard_uppers",
        ),
    ),
    Guard(
        name="a-new-source-partition-starts-its-first-batch-at-its-start",
        file="src/millstream/spark/sources.py",
        what="latestOffset: a partition the source gained since the batch's start ends the "
        "batch at its start position, so its first range is planned by the next batch",
        old="""\
        end = {p: begin[p] if p not in known else o for p, o in end.items()}
""",
        new="""\
        end = dict(end)  # MUTATION: a new partition's first end moves past its start
""",
        tests=("tests/unit/ingest/test_new_source_partitions.py",),
    ),
    Guard(
        name="a-shared-query-member-starting-empty-keeps-its-start",
        file="src/millstream/spark/sources.py",
        what="a shared query's member whose start is empty ({}: its source had no partition) "
        "plans from that start, so a partition its source gains is read from its first record",
        old="""\
                begin = start[n]
""",
        new="""\
                begin = start[n] or r.initialOffset()  # MUTATION: {} taken as no start
""",
        tests=("tests/unit/ingest/test_shared_query_new_partitions.py",),
    ),
    Guard(
        name="a-files-partial-last-line-is-no-record",
        file=FILES_SOURCE,
        what="the files source never counts the last file's last line before its newline is "
        "written (a producer mid-write)",
        old="""\
        return n if complete or not self.unterminated else n - 1
""",
        new="""\
        return n  # MUTATION: a half-written last line is a record
""",
        tests=(
            "tests/unit/ingest/test_files_source_contract.py::"
            "test_a_half_written_last_line_is_read_once_its_newline_is_written",
            "tests/unit/ingest/test_files_source_contract.py::"
            "test_every_complete_line_is_read_once_and_no_partial_line_ever",
        ),
    ),
    Guard(
        name="a-files-new-file-sorts-last",
        file=FILES_SOURCE,
        what="the files source refuses a new file whose name sorts before a listed one (it "
        "would shift every later offset)",
        old="""\
                if f.name not in known and last is not None and f.name < last:
""",
        new="""\
                if False:  # MUTATION: a new file may sort anywhere
""",
        tests=(
            "tests/unit/ingest/test_files_source_contract.py::"
            "test_a_new_file_sorting_before_a_listed_one_is_refused_naming_it",
        ),
    ),
    Guard(
        name="a-files-file-never-shrinks",
        file=FILES_SOURCE,
        what="the files source refuses a file that shrank since its lines were counted",
        old="""\
            if idx.size < prev.size:
""",
        new="""\
            if False:  # MUTATION: a file may shrink
""",
        tests=(
            "tests/unit/ingest/test_files_source_contract.py::"
            "test_a_file_that_shrank_was_rewritten_or_removed_is_refused",
        ),
    ),
    Guard(
        name="a-files-complete-file-never-changes",
        file=FILES_SOURCE,
        what="the files source refuses a file that changed after a later file appeared (it was "
        "complete)",
        old="""\
            if prev.complete and idx.size != prev.size:
""",
        new="""\
            if False:  # MUTATION: a complete file may grow
""",
        tests=(
            "tests/unit/ingest/test_files_source_contract.py::"
            "test_a_file_that_shrank_was_rewritten_or_removed_is_refused",
        ),
    ),
    Guard(
        name="a-files-counted-lines-never-move",
        file=FILES_SOURCE,
        what="the files source refuses a file whose counted lines no longer end where they did "
        "(rewritten)",
        old="""\
            if lines < prev.lines or int(idx.bounds[prev.lines]) != prev.end:
""",
        new="""\
            if False:  # MUTATION: a file may be rewritten
""",
        tests=(
            "tests/unit/ingest/test_files_source_contract.py::"
            "test_a_file_that_shrank_was_rewritten_or_removed_is_refused",
        ),
    ),
    Guard(
        name="a-files-file-never-removed",
        file=FILES_SOURCE,
        what="the files source refuses a listing without a file it listed before (removed or "
        "renamed)",
        old="""\
                if name not in names:
""",
        new="""\
                if False:  # MUTATION: a file may disappear
""",
        tests=(
            "tests/unit/ingest/test_files_source_contract.py::"
            "test_a_file_that_shrank_was_rewritten_or_removed_is_refused",
        ),
    ),
    Guard(
        name="a-files-range-read-whole-or-refused",
        file=FILES_SOURCE,
        what="a files range the files no longer hold whole is an error, not a short read passed "
        "as read",
        old="""\
        if base < hi:
""",
        new="""\
        if False:  # MUTATION: a short read passes
""",
        tests=(
            "tests/unit/ingest/test_files_source_contract.py::"
            "test_a_range_the_files_no_longer_hold_is_an_error_not_a_short_read",
        ),
    ),
    Guard(
        name="reader-cache-key-names-the-partition",
        file="src/millstream/table/read.py",
        what="a cached reader's key of a partition's sealed and merged rows names the "
        "partition (with no sealed file yet, its files name nothing)",
        old="""\
            "sealed",
            partition,
""",
        new="""\
            "sealed",  # MUTATION: the partition is not in the key
""",
        tests=(
            "tests/unit/table/test_reader_cache.py::"
            "test_a_cached_reader_keeps_partitions_of_one_shared_file_apart",
        ),
    ),
    Guard(
        name="reader-cache-keeps-no-filtered-sealed-rows",
        file="src/millstream/table/read.py",
        what="a cached reader keeps no partition's sealed rows read under a filter (its key "
        "names no filter, so an unfiltered read would be served them)",
        old="""\
        if cache is None or not use_delete_vectors or conditions:
""",
        new="""\
        if cache is None or not use_delete_vectors:  # MUTATION: filtered rows kept too
""",
        tests=(
            "tests/unit/table/test_reader_cache.py::"
            "test_a_filtered_cached_read_is_not_served_to_an_unfiltered_read",
        ),
    ),
    Guard(
        name="reingest-compacts-a-sealed-segment",
        file="src/millstream/sealing/reingest.py",
        what="re-ingesting a sealed segment compacts its rows as its seal did (a partitioned_by_"
        "key table reads them as final)",
        old="""\
        rows = engine_for(table_spec).compact(rows, floor=floor)
""",
        new="""\
        pass  # MUTATION: every row of the range, every version of a key
""",
        tests=(
            "tests/unit/api/test_api_reingest.py::"
            "test_a_lost_sealed_segment_is_reported_by_name_and_reingestion_restores_the_table",
        ),
    ),
    Guard(
        name="a-datastream-create-claims-its-tables",
        file="src/millstream/control/registry.py",
        what="creating a datastream claims its table and dead-letter table in the same "
        "transaction; one another datastream owns is refused (409 naming it)",
        old="""\
            owners.claim_tables(conn, claimed, spec.name, now)
""",
        new="""\
            pass  # MUTATION: two datastreams may write one table
""",
        tests=(
            "tests/unit/api/test_api_table_owners.py",
            "tests/unit/test_spec_multi_table.py::test_the_datastream_owns_every_listed_topics_table",
        ),
    ),
    Guard(
        name="a-tables-owner-row-is-unique",
        file="src/millstream/metastore/schema.py",
        what="a table has one owner row (its primary key): of two creates racing for one "
        "table, the second's insert fails and its retry sees the first",
        old="""\
    Column("table_name", String(128), primary_key=True),
    Column("datastream", String(64), nullable=False, index=True),
""",
        new="""\
    Column("table_name", String(128)),  # MUTATION: no key, two owners of a table
    Column("datastream", String(64), nullable=False, index=True),
""",
        tests=("tests/contract/test_postgres_table_owners.py",),
    ),
    Guard(
        name="a-writer-run-directly-claims-its-tables",
        file="src/millstream/spark/runner.py",
        what="a writer run without the controller claims its tables before it writes; "
        "another datastream's table is refused",
        old="""\
        self.catalog.store.claim_owners(
            [self.spec.table_name, self.spec.dead_letter_table], self.spec.name
        )
""",
        new="""\
        pass  # MUTATION: it writes whatever table it names
""",
        tests=(
            "tests/unit/api/test_api_table_owners.py::"
            "test_a_writer_run_without_the_controller_refuses_another_datastreams_table",
        ),
    ),
    Guard(
        name="a-lost-race-is-told-by-its-code",
        file="src/millstream/metastore/engine.py",
        what="a transaction PostgreSQL aborted as a lost race (SQLSTATE 40001, 40P01), at "
        "COMMIT too, is a conflict to run again, not an unknown outcome, by its code",
        old="""\
RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})
""",
        new="""\
RETRYABLE_SQLSTATES: frozenset[str] = frozenset()  # MUTATION: no code is a lost race
""",
        tests=("tests/unit/metastore/test_commit_error_codes.py",),
    ),
    Guard(
        name="a-running-seal-renews-its-claim",
        file="src/millstream/sealing/sealer.py",
        what="a seal renews its claim while it builds, so a seal longer than the claim's TTL "
        "is not taken over by another sealer",
        old="""\
                    renewed = s.store.renew_claim(
                        self.claimed, owner=s.claim_owner, ttl=s.claim_ttl
                    )
""",
        new="""\
                    renewed = dict(self.claimed)  # MUTATION: the claim is not extended
""",
        tests=(
            "tests/unit/sealing/test_claim_renewal.py::"
            "test_a_seal_longer_than_its_claim_is_not_taken_over_while_it_renews",
        ),
    ),
    Guard(
        name="a-renewal-never-revives-an-expired-claim",
        file=CLAIMS,
        what="renew_claim: a claim that expired on the store's clock (a frozen sealer) is not "
        "renewed; its seal's swap is refused",
        old="""\
            or cur.claimed_by != owner
            or not cur.claim_held(now)
""",
        new="""\
            or cur.claimed_by != owner  # MUTATION: an expired claim is renewed too
""",
        tests=(
            "tests/unit/sealing/test_claim_renewal.py::"
            "test_a_late_renewal_never_brings_an_expired_claim_back",
        ),
    ),
    Guard(
        name="an-update-keeps-the-datastreams-table",
        file="src/millstream/control/registry.py",
        what="Registry.update: a datastream's table name cannot change (another name may be "
        "another datastream's table, which the update would evolve and then write)",
        old="""\
            if new_table.name != rec.spec.table_name:
""",
        new="""\
            if False:  # MUTATION: an update may point a datastream at any table
""",
        tests=(
            "tests/unit/api/test_api_table_owners.py::"
            "test_an_update_cannot_point_a_datastream_at_another_datastreams_table",
        ),
    ),
    Guard(
        name="watchdog-a-caught-up-partition-is-not-behind",
        file="src/millstream/control/watchdog.py",
        what="the stall watchdog: a partition whose upper is the source's latest offset (an "
        "idle datastream) is not behind, so it is never reported stalled nor restarted",
        old="""\
            if end is None or end <= upper:
""",
        new="""\
            if end is None:  # MUTATION: a caught-up partition counts as behind
""",
        tests=(
            "tests/unit/api/test_worker_watchdog.py::test_a_healthy_idle_datastream_raises_nothing",
        ),
    ),
    Guard(
        name="watchdog-a-moving-upper-restarts-the-clock",
        file="src/millstream/control/watchdog.py",
        what="the stall watchdog: an upper that moved starts the stall time again, so a slow "
        "writer that advances but lags is not restarted as stalled",
        old="""\
            if last is None or last.upper != upper:
""",
        new="""\
            if last is None:  # MUTATION: a moving upper keeps its partition's stall clock
""",
        tests=(
            "tests/unit/api/test_worker_watchdog.py::"
            "test_a_slow_writer_that_advances_is_not_stalled",
        ),
    ),
    Guard(
        name="a-shared-query-members-write-failure-stays-its-own",
        file="src/millstream/spark/sink.py",
        what="in a shared query, a member whose part of a write task fails does not fail the "
        "task: the other members' parts of it are committed",
        old="""\
                return _member_failure(exc)
""",
        new="""\
                raise  # MUTATION: the task fails with it, the other members' parts too
""",
        tests=("tests/contract/test_contract_shared_query.py",),
        select="sqlite-local and write_fails",
    ),
    Guard(
        name="a-failed-member-commits-nothing-of-the-batch",
        file="src/millstream/spark/sink.py",
        what="in a shared query, a member whose part of some write task failed commits none "
        "of the batch (its other tasks' parts are deleted) and its error is raised, naming it",
        old="""\
            if name in failed:
""",
        new="""\
            if name in failed and not mine:  # MUTATION: its other tasks' parts commit
""",
        tests=("tests/contract/test_contract_shared_query.py",),
        select="sqlite-local and write_fails",
    ),
    Guard(
        name="kafka-end-never-below-what-the-source-showed",
        file="src/millstream/ingest/sources/kafka.py",
        what="latest_offsets_of: a watermark that moved is probed past, and a partition's "
        "end is never below the highest offset the source has shown (Tansu's watermark lags "
        "a multi-record produce batch)",
        old="""\
            first._probe_past(answered)
""",
        new="""\
            pass  # MUTATION: the watermark is trusted
""",
        tests=("tests/unit/ingest/test_kafka_latest_offsets.py",),
    ),
    Guard(
        name="kafka-still-watermark-is-probed",
        file="src/millstream/ingest/sources/kafka.py",
        what="_probe_past: a partition whose watermark rose is skipped only while it rises; "
        "once it holds still it is probed, so the rest of a burst's last produce batch past "
        "Tansu's short watermark is planned",
        old="""\
                if last is not None and w > last:
""",
        new="""\
                if last is not None and w >= last:  # MUTATION: never probed again
""",
        tests=(
            "tests/unit/ingest/test_kafka_latest_offsets.py::"
            "test_a_partition_whose_watermark_keeps_rising_is_not_probed_until_it_holds_still",
        ),
    ),
    Guard(
        name="kafka-deleted-start-is-an-error-not-a-jump",
        file="src/millstream/ingest/sources/kafka.py",
        what="a range read's start the broker no longer holds is reported by librdkafka "
        "(auto.offset.reset: error), never a silent jump to the earliest offset held",
        old="""\
            "auto.offset.reset": "error",
""",
        new="""\
            "auto.offset.reset": "earliest",  # MUTATION: silently from the first held
""",
        tests=("tests/unit/ingest/test_kafka_source_gaps.py",),
    ),
    Guard(
        name="kafka-source-gap-fails-unless-accepted",
        file="src/millstream/ingest/sources/kafka.py",
        what="records the broker deleted before they were read fail the read "
        "(SourceGapError) unless the source says on_data_loss: accept",
        old="""\
        if self.config.on_data_loss != "accept":
            raise SourceGapError(name, self.topic, partition, position, end, low)
""",
        new="""\
        pass  # MUTATION: every loss accepted
""",
        tests=("tests/unit/ingest/test_kafka_source_gaps.py",),
    ),
    Guard(
        name="source-offsets-gone-backwards-stop-the-partition",
        file="src/millstream/spark/sources.py",
        what="latestOffset: a partition whose source ends below the batch's start (the shard "
        "upper) is refused with SourceOffsetsRewoundError, not planned as consumed",
        old="""\
        self._refuse_rewound(begin, latest)
""",
        new="""\
        pass  # MUTATION: offsets that went backwards look consumed
""",
        tests=("tests/integration/test_kafka_offsets_rewound.py",),
    ),
    Guard(
        name="iceberg-position-deletes-written",
        file="src/millstream/table/iceberg.py",
        what="the Iceberg view: a snapshot's position delete file (and its delete manifest) is "
        "written whenever its data files hold rows Millstream's read does not return",
        old="""\
    for group, members in sorted(groups.items()):
""",
        new="""\
    for group, members in sorted(groups.items())[:0]:  # MUTATION: no position deletes
""",
        tests=(
            "tests/contract/test_contract_iceberg_view.py::"
            "test_superseded_rows_tombstones_and_trimmed_ranges_are_hidden_by_position_deletes",
        ),
        select="sqlite-local",
    ),
    Guard(
        name="iceberg-view-keeps-only-the-reads-rows",
        file="src/millstream/table/iceberg.py",
        what="the Iceberg view keeps a row of a data file only if it lies in one of the "
        "file's entries and Millstream's read returns its (partition, offset)",
        old="""\
        keep = pc.fill_null(pc.and_(keep, member), False).to_numpy(zero_copy_only=False)
""",
        new="""\
        keep = pc.fill_null(keep, False).to_numpy(zero_copy_only=False)  # MUTATION
""",
        tests=(
            "tests/contract/test_contract_iceberg_view.py::"
            "test_superseded_rows_tombstones_and_trimmed_ranges_are_hidden_by_position_deletes",
        ),
        select="sqlite-local",
    ),
    Guard(
        name="iceberg-merged-partial-rows",
        file="src/millstream/table/iceberg.py",
        what="the Iceberg view compares each returned row with its physical row: a partial "
        "table's unsealed merged row is written beside the data files, its physical row hidden",
        old="""\
    merged = w_sorted.select(user.names).cast(user).filter(pa.array(~same))
    if not same.all():
""",
        new="""\
    merged = w_sorted.select(user.names).cast(user).slice(0, 0)  # MUTATION
    if False:
""",
        tests=(
            "tests/contract/test_contract_iceberg_view.py::"
            "test_an_unsealed_partial_update_is_published_as_its_merged_row",
        ),
        select="sqlite-local",
    ),
    Guard(
        name="iceberg-pointer-compare-and-set",
        file="src/millstream/metastore/iceberg.py",
        what="swap_pointer moves a table's Iceberg pointer only from the row version the "
        "publisher read, so of two publishers that read the same pointer only one moves it",
        old="""\
        new_version = cas_update(conn, p, {"table_name": table}, expected.version, values)
""",
        new="""\
        now_at = _read(conn, table)  # MUTATION: whatever the row is now
        assert now_at is not None
        new_version = cas_update(conn, p, {"table_name": table}, now_at.version, values)
""",
        tests=(
            "tests/contract/test_contract_iceberg_view.py::"
            "test_of_two_publishers_that_read_the_same_pointer_only_one_moves_it",
        ),
        select="sqlite-local",
    ),
    Guard(
        name="iceberg-gc-keeps-retained-snapshots-files",
        file="src/millstream/table/iceberg.py",
        what="the view's GC keeps the manifest list, manifests, delete and merged-row files "
        "of every retained snapshot, not only the current one's",
        old="""\
        if snapshot_id < oldest or snapshot_id in seen:
""",
        new="""\
        if snapshot_id != current["current-snapshot-id"]:  # MUTATION
""",
        tests=(
            "tests/contract/test_contract_iceberg_view.py::"
            "test_expired_versions_expire_their_snapshots_and_gc_keeps_every_file_a_retained_snapshot_needs",
        ),
        select="sqlite-local",
    ),
    Guard(
        name="iceberg-gc-keeps-retained-metadata-files",
        file="src/millstream/table/iceberg.py",
        what="the view's GC keeps the earlier metadata files (a reader may hold their "
        "location) whose snapshot is retained",
        old="""\
        if rel is None or _version_of(rel) < oldest or not deep.exists(rel):
""",
        new="""\
        if True:  # MUTATION: only the current metadata file is kept
""",
        tests=(
            "tests/contract/test_contract_iceberg_view.py::"
            "test_expired_versions_expire_their_snapshots_and_gc_keeps_every_file_a_retained_snapshot_needs",
        ),
        select="sqlite-local",
    ),
    Guard(
        name="iceberg-reused-delete-file-only-when-unchanged",
        file="src/millstream/table/iceberg.py",
        what="an incremental publish lists a previous snapshot's delete file again only when "
        "every data file of the new view it holds positions of still hides them all",
        old="""\
    return bool(np.isin(old.facts.deleted, facts.deleted, assume_unique=True).all())
""",
        new="""\
    return True  # MUTATION: a changed file's old positions are listed again
""",
        tests=(
            "tests/contract/test_contract_iceberg_incremental.py::"
            "test_every_incremental_snapshot_reads_as_millstreams_read_of_its_version",
            "tests/contract/test_contract_iceberg_incremental.py::"
            "test_a_publish_reuses_the_delete_files_and_manifests_of_what_did_not_change",
            "tests/contract/test_contract_iceberg_incremental.py::"
            "test_a_rollback_that_shows_a_hidden_row_again_writes_that_files_positions_anew",
        ),
        select="sqlite-local",
    ),
    Guard(
        name="iceberg-incremental-recomputes-touched-keys-everywhere",
        file="src/millstream/table/iceberg.py",
        what="an incremental publish merges again every row of a touched key, in every data "
        "file of the version (an old file's row of an updated key is hidden)",
        old="""\
        hit |= _key_member(every, keys, touched)
""",
        new="""\
        pass  # MUTATION: only the rows of new and changed files are merged again
""",
        tests=(
            "tests/contract/test_contract_iceberg_incremental.py::"
            "test_a_publish_reuses_the_delete_files_and_manifests_of_what_did_not_change",
        ),
        select="sqlite-local",
    ),
    Guard(
        name="iceberg-incremental-only-from-the-current-snapshot",
        file="src/millstream/table/iceberg.py",
        what="a publisher builds on its cached snapshot only while the table's pointer still "
        "names it (another publisher's snapshot, and what garbage collection removed since, "
        "is not reused)",
        old="""\
        or state.metadata_location != pointer.metadata_location
""",
        new="""\
        or False  # MUTATION: build on the cached snapshot whoever moved the pointer
""",
        tests=(
            "tests/contract/test_contract_iceberg_incremental.py::"
            "test_a_publisher_never_builds_on_a_snapshot_garbage_collection_removed",
        ),
        select="sqlite-local",
    ),
    Guard(
        name="query-pushes-only-key-conditions-into-a-keyed-merge",
        file="src/millstream/cli/query.py",
        what="millstream query hands the reader conditions on a keyed table's key columns only "
        "(one on another column before the merge could bring back a superseded row)",
        old="""\
    columns = spec.primary_key if spec.keyed else tuple(spec.columns)
""",
        new="""\
    columns = tuple(spec.columns)  # MUTATION: any column of a keyed table, too
""",
        tests=(
            "tests/unit/test_cli_query.py::"
            "test_a_filter_on_a_key_is_applied_before_the_merge_and_one_on_a_value_after",
        ),
    ),
    Guard(
        name="a-reading-command-creates-no-home",
        file="src/millstream/cli/output.py",
        what="query and table commands open an existing deployment only: a missing local home "
        "is named, never created empty (a typo would read, and maintain, an empty one)",
        old="""\
        if not db.exists():
            raise HomeNotFoundError(str(settings.home), str(db))
""",
        new="""\
        if False:  # MUTATION: a missing home is created
            raise HomeNotFoundError(str(settings.home), str(db))
""",
        tests=("tests/unit/test_cli_query.py",),
        select="without_a_home",
    ),
    Guard(
        name="up-broker-reuses-its-recorded-port",
        file="src/millstream/local/tansu.py",
        what="`up`'s broker starts on the port recorded under the home, so specs saved against "
        "its bootstrap address still reach it after a restart",
        old="""\
    chosen = port if port is not None else (recorded.port if recorded is not None else None)
""",
        new="""\
    chosen = port  # MUTATION: a restart picks a new port
""",
        tests=(
            "tests/integration/test_up_broker.py::"
            "test_restarted_broker_keeps_the_port_it_was_given",
        ),
    ),
    Guard(
        name="up-broker-refuses-a-taken-recorded-port",
        file="src/millstream/local/tansu.py",
        what="a recorded (or given) broker port something else holds is an error naming it "
        "and the record is kept: the broker never moves away from the saved specs silently",
        old="""\
    elif not _port_free(chosen):
""",
        new="""\
    elif False:  # MUTATION: start anyway
""",
        tests=(
            "tests/integration/test_up_broker.py::test_recorded_port_taken_is_an_error_naming_it",
        ),
    ),
    Guard(
        name="a-take-over-is-judged-on-the-stores-clock",
        file="src/millstream/sealing/sealer.py",
        what="whether another sealer's claim on a run is live is judged on the metadata "
        "store's clock (in claim_run), never on the sealer's own, so a sealer whose clock runs "
        "behind still takes an expired claim over",
        old="""\
        claimed = self.store.claim_run(run, owner=self.claim_owner, ttl=self.claim_ttl)
""",
        new="""\
        if any(e.claim_held(self.clock.now()) for e in run):  # MUTATION: the sealer's clock
            return None
        claimed = self.store.claim_run(run, owner=self.claim_owner, ttl=self.claim_ttl)
""",
        tests=(
            "tests/unit/sealing/test_claim_clock_skew.py::"
            "test_an_expired_claim_is_taken_over_by_a_sealer_whose_clock_is_skewed",
        ),
        select="sqlite",
    ),
    Guard(
        name="a-member-that-left-the-shared-query-commits-nothing",
        file="src/millstream/spark/sink.py",
        what="a running shared query's commit commits a member's part of a batch only while "
        "the member is in the query with the incarnation the batch was written for",
        old="""\
                and incarnations[name] != {current.get(name)}
""",
        new="""\
                and False  # MUTATION: a member that left commits its batch in flight
""",
        tests=(
            "tests/unit/ingest/test_shared_query_membership.py::"
            "test_a_member_that_left_mid_batch_commits_nothing_of_it_and_rejoins_where_it_was",
        ),
    ),
    Guard(
        name="a-member-leaves-once-no-commit-holds-the-membership",
        file="src/millstream/spark/shared.py",
        what="a member leaves the running shared query under the membership's exclusive lock, "
        "so no commit of it is in flight once the leave returns",
        old="""\
                with self.membership.exclusive(timeout):
""",
        new="""\
                if True:  # MUTATION: no wait for the commits in flight
""",
        tests=(
            "tests/unit/ingest/test_shared_query_membership.py::"
            "test_a_member_leaves_only_once_no_commit_holds_the_membership",
        ),
    ),
    Guard(
        name="a-rejoined-member-enters-at-its-new-start",
        file="src/millstream/spark/sources.py",
        what="a member that joins the running shared query again plans from its new entry's "
        "start (its shard uppers), not from the end its previous incarnation left in the "
        "batch's start",
        old="""\
        entering = {n for n, at in self._entering.items() if n not in start or start[n] != at}
""",
        new="""\
        entering = {n for n in self._entering if n not in start}  # MUTATION: stale start
""",
        tests=(
            "tests/unit/ingest/test_shared_query_membership.py::"
            "test_a_member_that_left_mid_batch_commits_nothing_of_it_and_rejoins_where_it_was",
        ),
    ),
    Guard(
        name="campaign-iceberg-view-equals-the-model",
        file="src/millstream/table/iceberg.py",
        what="every position delete a snapshot needs is written (the commit-path campaign's "
        "view check catches a snapshot whose first hidden row shows)",
        old="""\
            schema=DELETE_SCHEMA,
        )
""",
        new="""\
            schema=DELETE_SCHEMA,
        ).slice(1)  # MUTATION: one position delete skipped
""",
        tests=(COMMIT_CAMPAIGN,),
    ),
    Guard(
        name="campaign-iceberg-gc-keeps-retained-snapshots-files",
        file="src/millstream/table/iceberg.py",
        what="the view's GC keeps the files of every retained snapshot (the commit-path "
        "campaign's view check finds a retained snapshot referencing a missing file)",
        old="""\
        if snapshot_id < oldest or snapshot_id in seen:
""",
        new="""\
        if snapshot_id != current["current-snapshot-id"]:  # MUTATION
""",
        tests=(COMMIT_CAMPAIGN,),
    ),
    Guard(
        name="iceberg-pointer-never-shows-an-expired-version",
        file="src/millstream/metastore/iceberg.py",
        what="swap_pointer refuses a version retention expired since the publisher read it "
        "(before a first publish no pointer keeps it; GC may have deleted its files)",
        old="""\
    if manifest_version < oldest:
""",
        new="""\
    if False:  # MUTATION: the pointer may name an expired version
""",
        tests=(
            "tests/contract/test_contract_iceberg_view.py::"
            "test_a_first_publish_whose_version_expires_and_is_collected_meanwhile_moves_no_pointer",
        ),
        select="sqlite-local",
    ),
    Guard(
        name="iceberg-merged-delete-files-keep-their-positions",
        file="src/millstream/table/iceberg.py",
        what="past the delete files allowed per partition, the positions of the smaller ones "
        "are written into the new delete file (their data files still hide those rows)",
        old="""\
                extra[path].extend(moving)
""",
        new="""\
                pass  # MUTATION: the merged delete files' positions are dropped
""",
        tests=(
            "tests/contract/test_contract_iceberg_incremental.py::"
            "test_an_update_writes_only_its_new_positions_beside_the_old_delete_files",
        ),
        select="sqlite-local",
    ),
    Guard(
        name="iceberg-new-positions-beside-the-old-delete-files",
        file="src/millstream/table/iceberg.py",
        what="a data file that keeps its old delete files gets its new hidden positions in a "
        "new delete file (the positions the old files do not hold)",
        old="""\
                np.setdiff1d(f.deleted, old.facts.deleted, assume_unique=True)
                if path in changed
""",
        new="""\
                f.deleted[:0]  # MUTATION: only the old delete files' positions are hidden
                if path in changed
""",
        tests=(
            "tests/contract/test_contract_iceberg_incremental.py::"
            "test_an_update_writes_only_its_new_positions_beside_the_old_delete_files",
        ),
        select="sqlite-local",
    ),
    Guard(
        name="iceberg-segment-mask-only-for-the-same-segments",
        file="src/millstream/table/iceberg.py",
        what="an incremental publish reuses which rows of a data file lie in its segments only "
        "while the file's segments are the ones that mask was computed for (a seal of one "
        "partition of a shared micro-batch file changes them)",
        old="""\
            if known is not None and known[0] == ranges:
""",
        new="""\
            if known is not None:  # MUTATION: a file's mask kept whatever its segments now are
""",
        tests=(
            "tests/unit/sealing/test_iceberg_publish_growth.py::"
            "test_a_seal_of_one_partition_of_a_shared_file_hides_that_partitions_rows_in_it",
        ),
    ),
    Guard(
        name="expiry-keeps-the-version-the-iceberg-pointer-shows",
        file="src/millstream/metastore/expiry.py",
        what="expire_versions: the floor never passes the version the table's Iceberg pointer "
        "shows (engines load that snapshot until the next publish; GC would delete its files)",
        old="""\
    if shown is not None and shown < floor:
""",
        new="""\
    if False:  # MUTATION: the pointer's version expires like any other
""",
        tests=(
            "tests/contract/test_contract_iceberg_view.py::"
            "test_the_snapshot_the_pointer_shows_keeps_its_files_after_its_version_would_expire",
        ),
        select="sqlite-local",
    ),
    Guard(
        name="multi-table-one-table-per-topic",
        file="src/millstream/datastream.py",
        what="DatastreamSpec.tables: a topic whose table (or dead-letter table) another topic's "
        "table already has is refused (two topics in one table would share its shards, and one "
        "topic's commits would be dropped as covered by the other's offsets)",
        old="""\
            if taken:
""",
        new="""\
            if False:  # MUTATION: two topics may map to one table
""",
        tests=("tests/unit/test_spec_multi_table.py", "tests/unit/control/test_topic_discovery.py"),
    ),
    Guard(
        name="multi-table-a-tables-failure-is-its-own",
        file="src/millstream/control/worker.py",
        what="Worker._member_failed: a table of a multi-table datastream that cannot go on "
        "waits out its own backoff; it never puts the datastream (its other tables) in ERROR",
        old="""\
        if fail and ds not in self.member_specs:
            self.registry.fail(ds, error)
""",
        new="""\
        if fail:  # MUTATION: one table's failure stops every table of its datastream
            self.registry.fail(datastream_of(ds), error)
""",
        tests=(
            "tests/integration/test_multi_table_kafka.py::"
            "test_a_worker_runs_every_table_of_a_topic_pattern_and_isolates_them",
        ),
    ),
    Guard(
        name="merged-copy-named-by-its-entries",
        file="src/millstream/table/merged.py",
        what="copy_path: a merged copy is named by a digest of the manifest's entries (file, "
        "partition, offset range), so a read of a table that changed since (a commit, seal, "
        "compaction, rollback) never finds the copy of an older version",
        old="""\
        "entries": sorted([e.file_path or "", e.partition, e.start, e.end] for e in entries),
""",
        new="""\
        "entries": [],  # MUTATION: any all-sealed manifest finds the table's last copy
""",
        tests=(
            "tests/unit/sealing/test_merged_copy.py::"
            "test_a_read_after_the_table_changed_merges_and_never_reads_the_older_copy",
        ),
    ),
    Guard(
        name="merged-copy-only-for-the-whole-table",
        file="src/millstream/table/read.py",
        what="read_manifest answers from a merged copy only a read of every partition (a read "
        "of some partitions of a table partitioned by key is merged from their segments)",
        old="""\
    if partitions is None and not include_system_columns and use_delete_vectors:
""",
        new="""\
    if not include_system_columns and use_delete_vectors:  # MUTATION: any partitions
""",
        tests=(
            "tests/unit/sealing/test_merged_copy.py::"
            "test_random_batches_seals_final_passes_and_rollbacks_read_equal_to_the_model",
        ),
        select="upsert-by-key",
    ),
    Guard(
        name="merged-copy-never-with-system-columns",
        file="src/millstream/table/read.py",
        what="read_manifest answers from a merged copy (which has the table's columns only) "
        "no read that asks for the system columns",
        old="""\
    if partitions is None and not include_system_columns and use_delete_vectors:
""",
        new="""\
    if partitions is None and use_delete_vectors:  # MUTATION: system columns too
""",
        tests=(
            "tests/unit/sealing/test_merged_copy.py::"
            "test_random_batches_seals_final_passes_and_rollbacks_read_equal_to_the_model",
        ),
        select="upsert-cmp",
    ),
    Guard(
        name="merged-copy-filtered-by-the-conditions",
        file="src/millstream/table/read.py",
        what="a read with key conditions answered from a merged copy returns only the copy's "
        "rows that meet them",
        old="""\
            return copy.filter(_expression(conditions)) if conditions else copy
""",
        new="""\
            return copy  # MUTATION: the conditions are ignored
""",
        tests=(
            "tests/unit/sealing/test_merged_copy.py::"
            "test_random_batches_seals_final_passes_and_rollbacks_read_equal_to_the_model",
        ),
        select="upsert-cmp",
    ),
    Guard(
        name="an-aborted-pointer-swap-is-run-again",
        file="src/millstream/metastore/engine.py",
        what="rerun_if_aborted: a pointer swap (a pin's release, a re-ingest job's lease or "
        "outcome) the server aborted (a deadlock) committed nothing and is run again, instead "
        "of failing the publish",
        old="""\
            if not is_retryable(exc) or attempt == MAX_CAS_RETRIES - 1:
""",
        new="""\
            if True:  # MUTATION: an aborted write fails
""",
        tests=(
            "tests/unit/metastore/test_aborted_writes_rerun.py::"
            "test_a_pointer_swap_chosen_as_a_deadlock_victim_is_run_again_and_moves_the_pointer",
        ),
    ),
    Guard(
        name="staged-pieces-in-position-order",
        file="src/millstream/table/writer.py",
        what="RowStager: a write task's rows staged a piece at a time come in (partition, "
        "offset) order, or the task fails naming both positions (its file would not hold its "
        "rows in the order every staged file does)",
        old="""\
        if self._last is not None and first <= self._last:
""",
        new="""\
        if False:  # MUTATION: pieces in any order
""",
        tests=(
            "tests/unit/ingest/test_sink_stages_as_it_decodes.py::"
            "test_pieces_out_of_position_order_are_refused_naming_both_positions",
        ),
    ),
    Guard(
        name="a-commit-together-rolls-back-a-failed-member-alone",
        file=MANIFEST,
        what="each_isolated: in the one transaction a shared query's members commit in, a "
        "member that is fenced or loses a compare-and-set is rolled back to its savepoint "
        "alone; the others commit",
        old="""\
        except MillstreamError as exc:
            savepoint.rollback()
            out[key] = exc
            continue
""",
        new="""\
        except MillstreamError:
            raise  # MUTATION: one member's failure rolls back every member's commit
""",
        tests=(
            "tests/contract/test_contract_shared_query.py::"
            "test_a_member_a_concurrent_transaction_fences_holds_back_no_other",
        ),
        select="sqlite-local",
    ),
    Guard(
        name="a-commit-together-undoes-a-failed-members-writes",
        file=MANIFEST,
        what="each_isolated: a member whose compare-and-set fails after it wrote rows (its "
        "entries) is rolled back to its savepoint, so none of them commits with the others",
        old="""\
        except MillstreamError as exc:
            savepoint.rollback()
""",
        new="""\
        except MillstreamError as exc:
            savepoint.commit()  # MUTATION: a failed member's writes commit with the others
""",
        tests=(
            "tests/contract/test_contract_shared_query.py::"
            "test_a_member_that_loses_a_race_in_the_shared_commit_commits_alone_after_it",
        ),
    ),
    Guard(
        name="a-commit-together-checks-each-members-files-before-commit",
        file="src/millstream/metastore/append.py",
        what="append_batches_txn: each member's precondition (its staged files young enough "
        "for GC's grace) is checked right before the shared COMMIT; a member that fails it "
        "commits nothing",
        old="""\
            check()  # last, with every lock held: right before COMMIT
""",
        new="""\
            pass  # MUTATION: a member's precondition is not checked
""",
        tests=(
            "tests/contract/test_contract_shared_query.py::"
            "test_a_member_whose_staged_files_are_too_old_commits_nothing_and_the_others_commit",
        ),
        select="sqlite-local",
    ),
    Guard(
        name="multi-table-a-paused-table-commits-nothing",
        file="src/millstream/control/worker.py",
        what="Worker._tables_of: a table of a multi-table datastream paused on its own is no "
        "member of the shared query (its writer stops at its uppers; the others run on)",
        old="""\
                if table in paused:
                    continue
""",
        new="""\
                if False:  # MUTATION: a table paused on its own keeps its writer
                    continue
""",
        tests=(
            "tests/unit/control/test_worker_table_pause.py::"
            "test_a_paused_table_leaves_the_shared_query_and_rejoins_on_resume",
        ),
    ),
    Guard(
        name="multi-table-rollback-needs-its-own-table-paused",
        file="src/millstream/api/status.py",
        what="require_writer_stopped: a rollback of a table of a running multi-table "
        "datastream needs that table paused, not any of its tables",
        old="""\
    if rec.spec.multi_table and base in rec.paused_tables:
""",
        new="""\
    if rec.spec.multi_table and rec.paused_tables:  # MUTATION: any table's pause will do
""",
        tests=("tests/unit/api/test_api_table_pause.py::test_one_table_pauses_and_resumes_alone",),
    ),
    Guard(
        name="iceberg-cached-metadata-only-for-the-pointers-file",
        file="src/millstream/table/iceberg.py",
        what="PublishCache.metadata: a publisher builds on the table metadata it remembers "
        "only while the pointer names that very file (another publisher's snapshot is read)",
        old="""\
        if known is not None and known.path == path:
""",
        new="""\
        if known is not None:  # MUTATION: the remembered metadata, whatever the pointer names
""",
        tests=(
            "tests/contract/test_contract_iceberg_incremental.py::"
            "test_a_cache_whose_snapshot_another_publisher_replaced_publishes_in_full",
        ),
        select="sqlite-local",
    ),
    Guard(
        name="iceberg-unchanged-only-when-the-pointer-shows-the-version",
        file="src/millstream/table/iceberg.py",
        what="publish: a table is skipped as unchanged (no manifest read) only when its "
        "pointer shows its current manifest version",
        old="""\
        if pointer.manifest_version >= info.manifest_version and not any(
""",
        new="""\
        if not any(  # MUTATION: any published table counts as unchanged
""",
        tests=(
            "tests/unit/sealing/test_iceberg_publish_many_tables.py::"
            "test_a_round_where_one_of_fifty_tables_changed_reads_and_writes_that_table_only",
        ),
    ),
    Guard(
        name="iceberg-unchanged-table-still-drops-expired-snapshots",
        file="src/millstream/table/iceberg.py",
        what="publish: an unchanged table whose snapshots retention expired is not skipped: "
        "its next metadata drops them (GC may remove their files)",
        old="""\
        if pointer.manifest_version >= info.manifest_version and not any(
            i < oldest for i in listed
        ):  # nothing new, nothing expired: no manifest read
""",
        new="""\
        if pointer.manifest_version >= info.manifest_version:  # MUTATION: expiry ignored
""",
        tests=(
            "tests/unit/sealing/test_iceberg_publish_many_tables.py::"
            "test_a_round_where_one_of_fifty_tables_changed_reads_and_writes_that_table_only",
        ),
    ),
    Guard(
        name="iceberg-name-mapping-follows-the-schema",
        file="src/millstream/table/iceberg.py",
        what="write_snapshot: the name mapping is written again whenever the snapshot's "
        "schema is not the previous metadata's current one (a new column must be mapped)",
        old="""\
        or previous.current_schema_id != schema.schema_id
        or NAME_MAPPING not in previous.properties
""",
        new="""\
        or NAME_MAPPING not in previous.properties  # MUTATION: the first mapping forever
""",
        tests=(
            "tests/contract/test_contract_iceberg_view.py::"
            "test_schema_changes_keep_field_ids_and_old_snapshots_read_with_their_schema",
        ),
        select="sqlite-local",
    ),
    Guard(
        name="sealskip-age-threshold-reads-again",
        file=SEALER_FILE,
        what="Sealer._quiet: a pass skips the table's manifest read only while no "
        "pending run reached a threshold (its age threshold too)",
        old="""\
        if any(run.due(self.thresholds, now, self.phase) for run in read.runs.values()):
            return False
""",
        new="""\
        pass  # MUTATION: no threshold is checked before skipping
""",
        tests=(
            "tests/unit/sealing/test_sealer.py::"
            "test_a_run_whose_age_threshold_passes_is_sealed_at_the_next_pass_without_a_commit",
        ),
    ),
    Guard(
        name="sealskip-version-change-reads-again",
        file=SEALER_FILE,
        what="Sealer._quiet: a pass skips the manifest read only after judging what changed "
        "since the version it last read (a commit that makes a run due reads again)",
        old="""\
        read = last.advanced(changes)
""",
        new="""\
        read = last  # MUTATION: the changes since the last read are not looked at
""",
        tests=(
            "tests/unit/sealing/test_sealer.py::"
            "test_a_commit_makes_the_next_pass_read_and_seal_what_it_made_due",
        ),
    ),
    Guard(
        name="sealskip-force-commit-reads-again",
        file=SEALER_FILE,
        what="Sealer._quiet: a force commit naming a segment of a pending run makes the pass "
        "read the manifest and seal it",
        old="""\
        if any(p in read.runs and read.runs[p].first_seq <= seq for p, seq in forced.items()):
            return False
""",
        new="""\
        pass  # MUTATION: force commits do not stop the skip
""",
        tests=(
            "tests/unit/sealing/test_sealer.py::test_a_force_commit_is_honoured_at_the_next_pass",
        ),
    ),
    Guard(
        name="sealpass-a-run-started-since-the-read-is-judged",
        file=SEALER_FILE,
        what="_LastRead.advanced: an entry appended to a partition that had nothing pending at "
        "the last read starts a run the pass judges (else that run is sealed only when "
        "something else makes the pass read the manifest)",
        old="""\
            if run is None:  # the partition had nothing pending: the entry starts its run
                runs[e.partition] = _Run(e.seq, e.row_count, e.size_bytes, e.created_at)
                continue
""",
        new="""\
            if run is None:  # MUTATION: an entry of a partition with nothing pending is ignored
                continue
""",
        tests=(
            "tests/unit/sealing/test_sealer.py::"
            "test_a_run_started_after_the_last_read_is_judged_and_sealed_when_due",
        ),
    ),
    Guard(
        name="sealpass-appended-rows-counted",
        file=SEALER_FILE,
        what="_LastRead.advanced: the rows of the entries appended since the last read add up "
        "over passes, so a run that reaches flush_rows by many small appends is sealed",
        old="""\
                run.rows + e.row_count,
""",
        new="""\
                run.rows,  # MUTATION: the appended rows are not counted
""",
        tests=(
            "tests/unit/sealing/test_sealer.py::"
            "test_appends_that_make_nothing_due_are_judged_without_a_manifest_read_until_one_does",
        ),
    ),
    Guard(
        name="sealpass-other-changes-read-the-manifest",
        file=SEALER_FILE,
        what="_LastRead.advanced: a change since the last read other than appended consuming "
        "entries (an entry removed or a sealed one added: a seal by another sealer, a "
        "compaction, a rollback, a re-ingest) makes the pass read the whole manifest and check "
        "compaction",
        old="""\
        if (
            changes.version < self.version
            or changes.removed
            or any(e.state is not SegmentState.CONSUMING for e in changes.added)
        ):
            return None
""",
        new="""\
        if changes.version < self.version:  # MUTATION: every change taken as appends
            return None
""",
        tests=(
            "tests/unit/sealing/test_sealer.py::"
            "test_another_sealers_seals_between_passes_are_seen_and_compacted",
        ),
    ),
    Guard(
        name="sealpass-unknown-changes-read-the-manifest",
        file=SEALER_FILE,
        what="Sealer._quiet: a pass whose read of the changes since its last read fails reads "
        "the manifest as before (an unknown answer never skips a pass)",
        old="""\
                log.warning("cannot read the manifest changes of %s: %s", self.table, exc)
                return False
""",
        new="""\
                log.warning("cannot read the manifest changes of %s: %s", self.table, exc)
                return True  # MUTATION: an unknown answer skips the pass
""",
        tests=(
            "tests/unit/sealing/test_sealer.py::"
            "test_a_pass_whose_changes_cannot_be_read_reads_the_manifest_and_seals_what_is_due",
        ),
    ),
    Guard(
        name="sealspread-never-later-than-flush-seconds",
        file="src/millstream/sealing/planning.py",
        what="due_totals: a run flush_seconds old is due whatever its table's slot: spreading "
        "seals over time only ever seals a run earlier",
        old="""\
    if now - oldest >= t.flush_seconds:
        return True  # the user's bound: a run is sealed within flush_seconds, spread or not
""",
        new="""\
    pass  # MUTATION: a run's age alone does not make it due
""",
        tests=(
            "tests/unit/sealing/test_seal_spread.py::"
            "test_tables_started_together_seal_spread_over_flush_seconds_never_later",
        ),
    ),
    Guard(
        name="iceberg-cache-drops-left-files-only-after-the-pointer-moved",
        file="src/millstream/table/iceberg.py",
        what="publish: the columns of files that left a table are dropped from the publish "
        "cache only once a view without them is published and remembered; a publish that fails "
        "keeps them for its retry, which reads them (they give the touched keys)",
        old="""\
    committed_at = store.version_committed_at(table, v)
""",
        new="""\
    if cache is not None:  # MUTATION: dropped before the pointer moved
        cache.retain(deep, table, live_files(manifest))
    committed_at = store.version_committed_at(table, v)
""",
        tests=(
            "tests/unit/sealing/test_iceberg_publish_cache_bound.py::"
            "test_a_failed_publish_keeps_the_columns_its_retry_needs",
        ),
    ),
    Guard(
        name="dead-letter-clean-batch-costs-nothing",
        file="src/millstream/metastore/append.py",
        what="append_txn: a batch without a dead letter reads, locks and writes nothing of the "
        "dead-letter table (no statement, no version, nothing to publish)",
        old="""\
    if covered is not None and not any(_with_rows(a) for a in appends):
        return _covered_only(table, appends, covered)
""",
        new="""\
    pass  # MUTATION: a clean batch reads and locks the dead-letter table
""",
        tests=(DEAD_LETTERS + "test_clean_batches_leave_the_dead_letter_table_alone",),
        select="sqlite-local",
    ),
    Guard(
        name="dead-letter-decides-against-table-upper",
        file="src/millstream/metastore/append.py",
        what="append_txn: a dead-letter shard decides against the higher of its upper and its "
        "table's (it lags after clean batches); against its own, the first dead letter after a "
        "clean batch is a gap and is never recorded",
        old="""\
            start = (max(start[0], base.upper if base else a.lo), start[1])
""",
        new="""\
            start = start  # MUTATION: against its own (lagging) upper
""",
        tests=(
            DEAD_LETTERS
            + "test_a_dead_letter_after_clean_batches_survives_replay_and_restart_exactly_once",
        ),
        select="sqlite-local",
    ),
    Guard(
        name="dead-letter-table-rolls-back-with-its-table",
        file="src/millstream/metastore/rollback.py",
        what="rollback_partition: a dead-letter table is not rolled back alone (its range would "
        "count as covered by its table's upper and its dead letters never be read again)",
        old="""\
        if base != table and find_table(conn, base, missing_ok=True) is not None:
""",
        new="""\
        if False:  # MUTATION: a dead-letter table rolls back alone
""",
        tests=(DEAD_LETTERS + "test_a_dead_letter_table_is_not_rolled_back_alone",),
        select="sqlite-local",
    ),
    Guard(
        name="dead-letter-reconciled-by-table-upper",
        file="src/millstream/table/commit.py",
        what="_persisted: after an unknown outcome a dead-letter range counts as landed where "
        "its table's upper covers it (its shard moves only with a dead letter)",
        old="""\
            table = read[base] if base != name and base in read else {}
""",
        new="""\
            table = {}  # MUTATION: the dead-letter shard alone
""",
        tests=(
            DEAD_LETTERS
            + "test_a_clean_batch_whose_commit_outcome_is_unknown_is_reconciled_as_landed",
        ),
        select="sqlite-local",
    ),
    Guard(
        name="shared-commit-isolates-a-moved-row",
        file="src/millstream/metastore/append.py",
        what="append_batches_txn: a compare-and-set of the batches' one write that falls short "
        "(a concurrent writer moved a row) runs each batch again in a savepoint of its own, so "
        "that table alone is decided again and the others land",
        old="""\
    except (CommitConflictError, IntegrityError):
""",
        new="""\
    except ():  # MUTATION: one table's moved row fails every table's commit
""",
        tests=(SHARED_COMMIT,),
        select="concurrent",
    ),
    Guard(
        name="shared-commit-checks-every-shard-version",
        file="src/millstream/metastore/append.py",
        what="_write: the shards of every table of a shared commit are compare-and-set in one "
        "statement whose row count must equal theirs (a shard a concurrent writer moved is "
        "detected, not overwritten)",
        old="""\
    cas_update_many(conn, s.shards, [m for p in plans for m in p.moved])
""",
        new="""\
    try:  # MUTATION: a shard that moved is not noticed
        cas_update_many(conn, s.shards, [m for p in plans for m in p.moved])
    except CommitConflictError:
        pass
""",
        tests=(SHARED_COMMIT,),
        select="concurrent",
    ),
    Guard(
        name="poll-winners-only-for-the-same-spec",
        file=POLL_FILE,
        what="read_polled: a cached reader merges new rows onto its previous read's winners "
        "only if the table's spec (its schema) is the one they were merged under",
        old="""\
            and tag.spec_key == _spec_key(spec)
""",
        new="""\
            # MUTATION: the spec is not compared
""",
        tests=(
            f"{POLL_TEST}::test_a_cached_poll_reads_what_a_new_uncached_reader_reads",
            f"{POLL_TEST}::test_a_schema_change_between_polls_shows_the_new_column",
        ),
    ),
    Guard(
        name="poll-removed-entries-only-after-seals-and-compactions",
        file=POLL_FILE,
        what="_new_rows: entries gone since the previous poll are taken as reorganized (their "
        "rows kept) only if the version log shows nothing but appends, seals and compactions "
        "since (a rollback or re-ingestion merges in full)",
        old="""\
        if len(ops) != manifest.version - state.version or not set(ops) <= REORGANIZING:
""",
        new="""\
        if len(ops) != manifest.version - state.version:  # MUTATION: any operation passes
""",
        tests=(
            f"{POLL_TEST}::test_a_cached_poll_reads_what_a_new_uncached_reader_reads",
            f"{POLL_TEST}::test_a_rollback_between_polls_brings_the_rows_it_removed_back_out",
        ),
    ),
    Guard(
        name="poll-delete-without-comparison-value-merges-in-full",
        file=POLL_FILE,
        what="_mergeable: a new delete without a comparison value (its value comes from its "
        "partition's earlier rows) makes the poll merge in full",
        old="""\
        if pc.any(lacking).as_py():
            return False
""",
        new="""\
        if pc.any(lacking).as_py():
            pass  # MUTATION: merged onto the winners anyway
""",
        tests=(
            f"{POLL_TEST}::test_a_cached_poll_reads_what_a_new_uncached_reader_reads",
            f"{POLL_TEST}::"
            "test_a_delete_without_a_comparison_value_takes_its_partitions_earlier_value",
        ),
    ),
    Guard(
        name="transient-spark-failure-restarts-the-writer",
        file="src/millstream/spark/runner.py",
        what="run: a query or an available-now run that failed on one of Spark's transient "
        "failures (a Python process that did not connect back in time) restarts from the shard "
        "uppers after a backoff instead of ending the run with the error",
        old="""\
                if transient is not None:
                    if not self._wait_transient(transient, error):
                        return self.stats  # stopped while waiting
""",
        new="""\
                if transient is not None:
                    raise error  # MUTATION: a transient failure ends the run
""",
        tests=(
            f"{TRANSIENT_TEST}::"
            "test_a_writer_whose_source_process_does_not_connect_back_restarts_and_commits_once",
            f"{TRANSIENT_TEST}::"
            "test_an_available_now_run_restarts_when_its_results_socket_cannot_be_opened",
        ),
    ),
    Guard(
        name="transient-spark-failure-restarts-the-shared-query-with-its-members",
        file="src/millstream/spark/shared.py",
        what="run: a shared query that failed on one of Spark's transient failures restarts "
        "every member from its shard uppers after a backoff, with the same members, instead of "
        "raising (which fails every member's writer)",
        old="""\
                transient = None if _restartable(error) else transient_spark_failure(error)
                if transient is not None:
                    delay = self.transient.failed(transient, error)
""",
        new="""\
                transient = None  # MUTATION: a transient failure fails every member
                if transient is not None:
                    delay = self.transient.failed(transient, error)
""",
        tests=(
            f"{TRANSIENT_TEST}::"
            "test_a_shared_query_restarts_its_members_on_a_transient_failure_and_commits_each_once",
        ),
    ),
    Guard(
        name="transient-restarts-back-off",
        file="src/millstream/spark/runner.py",
        what="TransientRestarts.failed: a restart after a transient failure waits a capped "
        "exponential backoff (not a tight loop that loads the machine further)",
        old="""\
        return self.backoff.delay(self.in_a_row, self.rng)
""",
        new="""\
        return 0.0  # MUTATION: restarts in a tight loop
""",
        tests=(
            f"{TRANSIENT_UNIT}::test_restarts_back_off_doubling_to_a_cap_and_a_commit_ends_the_row",
            f"{TRANSIENT_UNIT}::test_a_writer_gives_up_only_after_a_long_row_without_a_commit",
        ),
    ),
    Guard(
        name="transient-row-ends-only-when-the-uppers-move",
        file="src/millstream/spark/runner.py",
        what="TransientRestarts.started_at: a row of transient failures ends only when a start "
        "finds the shard uppers moved (a batch committed), so a writer that never commits gives "
        "up and says so instead of restarting forever",
        old="""\
        if positions != self._positions:
            self.in_a_row = 0
""",
        new="""\
        if positions is not None:  # MUTATION: every start ends the row
            self.in_a_row = 0
""",
        tests=(
            f"{TRANSIENT_UNIT}::test_restarts_back_off_doubling_to_a_cap_and_a_commit_ends_the_row",
        ),
    ),
    Guard(
        name="transient-spark-failure-known-by-sparks-text",
        file="src/millstream/errors.py",
        what="transient_spark_failure: Spark's transient failures that reach the driver as text "
        "(the JVM's connect-back timeout, a Python worker's CANNOT_OPEN_SOCKET) are known by "
        "their message, not only by a PySpark error class raised in this process",
        old="""\
        if named == name or pattern.search(text):
""",
        new="""\
        if named == name:  # MUTATION: Spark's text not read
""",
        tests=(f"{TRANSIENT_UNIT}::test_spark_errors_of_its_own_machinery_are_transient",),
    ),
    Guard(
        name="transient-spark-failure-not-when-ours-is-named",
        file="src/millstream/errors.py",
        what="transient_spark_failure: a Spark failure whose text names an error of ours (a "
        "fenced commit, a bad record) is never transient: that error decides (a bad record with "
        "bad_records: fail must stop the datastream, not restart it)",
        old="""\
    if ours is not None and not issubclass(ours.kind, SparkTransientError):
        return None
""",
        new="""\
    if ours is not None and ours is None:  # MUTATION: Spark's words win over ours
        return None
""",
        tests=(f"{TRANSIENT_UNIT}::test_no_other_error_is_transient",),
    ),
    Guard(
        name="parsed-spec-only-for-the-same-stored-spec",
        file="src/millstream/metastore/tables.py",
        what="parsed_spec: a table spec parsed earlier by the process is reused only while the "
        "stored spec equals the one it was parsed from (a schema change reaches the next batch)",
        old="""\
    if hit is not None and hit[0] == stored:
""",
        new="""\
    if hit is not None:  # MUTATION: the stored spec is not compared
""",
        tests=(
            "tests/unit/ingest/test_shared_write_caches.py::"
            "test_a_schema_change_between_batches_reaches_the_next_batch_of_a_shared_query",
        ),
    ),
    Guard(
        name="group-sink-only-of-its-own-options",
        file="src/millstream/spark/sink.py",
        what="group_sink: a process reuses a shared query's sink only for exactly the options it "
        "was made from (another query's bad_records, epochs or specs get a sink of their own)",
        old="""\
    return _group_sink_of(json.dumps(dict(options), sort_keys=True))
""",
        new="""\
    return _group_sink_of(json.dumps(sorted(options)))  # MUTATION: keyed by option names
""",
        tests=(
            "tests/unit/ingest/test_shared_write_caches.py::"
            "test_two_queries_of_different_options_in_one_process_each_write_by_their_own",
        ),
    ),
    Guard(
        name="class-archive-in-place-only-after-a-clean-exit",
        file="src/millstream/spark/session.py",
        what="ClassArchive.settle: the JVM's class archive is put where later runs' JVMs map "
        "it only when the JVM that wrote it exited cleanly (one that died while writing it "
        "leaves a half-written file, which is removed)",
        old="""\
                if exit_code == 0:
                    os.replace(pending, self.path)
""",
        new="""\
                if True:  # MUTATION: in place whatever the exit
                    os.replace(pending, self.path)
""",
        tests=(
            "tests/unit/test_cli_run_session.py::"
            "test_the_class_archive_is_used_once_written_and_written_once",
        ),
    ),
    Guard(
        name="probe-settles-only-at-a-known-fetched-watermark",
        file="src/millstream/ingest/sources/kafka.py",
        what="KafkaReader._probe: a partition is settled at the high watermark its fetch "
        "answered only when that watermark is known and not below what was read; otherwise "
        "the probe reads on to the partition's end (settled short, the records past it were "
        "never planned while the lag said 0)",
        old="""\
                        if high is None or high < end:
                            reached[tp] = (end, False)  # read on to its end (EOF)
                            continue
                        reached[tp] = (high, True)
""",
        new="""\
                        reached[tp] = (max(high or end, end), True)  # MUTATION: settled at once
""",
        tests=(
            "tests/unit/ingest/test_kafka_latest_offsets.py::"
            "test_a_probe_settles_at_the_watermark_its_first_fetch_answers",
        ),
    ),
    Guard(
        name="gate-answer-only-for-its-own-datastream",
        file="src/millstream/spark/sources.py",
        what="StreamReader._follow_shards: a plan reuses a standby gate's answer (may this "
        "worker commit?) only for members of the same datastream, worker and takeover TTL; "
        "a member of another datastream asks its own (a standby planned past its shard "
        "uppers on an active's answer)",
        old="""\
        key = (store.url, gate.datastream, gate.worker, gate.takeover_ttl)
""",
        new="""\
        key = (store.url, "", gate.worker, gate.takeover_ttl)  # MUTATION: any datastream's
""",
        tests=(
            "tests/unit/ingest/test_shared_query_planning.py::"
            "test_a_plan_asks_each_datastreams_standby_gate_once_and_each_follows_its_own",
        ),
    ),
    Guard(
        name="seal-reads-every-row-group-that-may-hold-its-rows",
        file="src/millstream/table/read.py",
        what="row_groups_holding: read_entries skips a data file's row group only when its "
        "footer statistics prove it holds no row of the entries (a group shared by two "
        "partitions of a micro-batch file is read for each)",
        old="""\
                    parts.min <= e.partition <= parts.max
                    and offs.min < e.end
                    and offs.max >= e.start
""",
        new="""\
                    parts.min == e.partition == parts.max  # MUTATION: a shared group is skipped
""",
        tests=(
            "tests/unit/sealing/test_sealer.py::"
            "test_a_seal_of_one_partition_of_a_shared_file_keeps_its_rows_in_a_row_group_it_shares",
        ),
    ),
    Guard(
        name="publish-builds-on-an-offered-read-only-of-its-manifest",
        file="src/millstream/table/iceberg.py",
        what="PublishCache.take_read: a full view builds on the read an --available-now run's "
        "final seal offered only when that read is of the manifest published (its merged "
        "copy's digest); the read of another manifest is dropped and the view merges",
        old="""\
        return rows if digest == copy_path(manifest) else None
""",
        new="""\
        return rows  # MUTATION: the read of any manifest of the table
""",
        tests=(
            "tests/unit/sealing/test_iceberg_publisher.py::"
            "test_a_publish_builds_on_the_final_seals_read_only_for_the_manifest_it_was_read_from",
        ),
    ),
    Guard(
        name="poll-chunk-kept-only-without-a-new-key",
        file=POLL_FILE,
        what="_take_out: a chunk of the previous winners is kept as it is (not copied) only if "
        "it holds none of the new rows' keys; a chunk holding one is filtered",
        old="""\
        if not hit.any():
""",
        new="""\
        if hit.sum() <= 1:  # MUTATION: a chunk with one new key is kept as it is
""",
        tests=(
            f"{POLL_TEST}::test_a_poll_copies_only_the_chunks_holding_a_new_key",
            f"{POLL_TEST}::"
            "test_a_cached_poll_over_many_small_chunks_reads_what_a_new_uncached_reader_reads",
        ),
    ),
    Guard(
        name="restarts-bounded-in-a-row",
        file="src/millstream/spark/runner.py",
        what="DatastreamRunner.run: a writer whose commits are fenced, gapped or expired again "
        "and again without a commit in between fails past MAX_RESTARTS in a row instead of "
        "restarting forever",
        old="""\
                elif not _restartable(error) or self._count_restart() > MAX_RESTARTS:
""",
        new="""\
                elif not _restartable(error) or self._count_restart() < 0:  # MUTATION: unbounded
""",
        tests=(
            "tests/integration/test_restarts_in_a_row.py::"
            "test_a_writer_fenced_again_and_again_without_a_commit_fails_at_the_bound",
        ),
    ),
    Guard(
        name="local-file-fsynced-before-its-commit",
        file="src/millstream/storage/deepstore.py",
        what="DeepStore._make_durable: a file written to a local deep store is fsynced before "
        "the write returns, so the manifest commit that references it (durable in the "
        "metadata store) never names a file whose data is only in the page cache",
        old="""\
        _fsync(full)
""",
        new="""\
        pass  # MUTATION: the file's data is left in the page cache
""",
        tests=(
            "tests/unit/table/test_staged_files_durable.py::"
            "test_a_staged_file_and_its_directory_are_fsynced_before_the_commit_referencing_it",
        ),
    ),
    Guard(
        name="row-stager-syncs-before-it-returns",
        file="src/millstream/table/writer.py",
        what="RowStager.finish: a write task's file staged a row group at a time (the sink's "
        "path) is made durable before the task returns it for the commit",
        old="""\
        self.deep.sync(self.path)  # before any commit references it
""",
        new="""\
        pass  # MUTATION: not synced
""",
        tests=(
            "tests/unit/table/test_staged_files_durable.py::"
            "test_a_staged_file_and_its_directory_are_fsynced_before_the_commit_referencing_it",
        ),
    ),
    Guard(
        name="class-archive-pruned-only-when-unused",
        file="src/millstream/spark/session.py",
        what="ClassArchive.prune: a new class archive removes only the other archives no run "
        "used for a day, never one a run marked used lately (its JVM may be mapping it)",
        old="""\
                if now - other.stat().st_mtime > STALE_ARCHIVE_SECONDS:
""",
        new="""\
                if other.exists():  # MUTATION: every other archive, used or not
""",
        tests=(
            "tests/unit/test_cli_run_session.py::"
            "test_a_new_class_archive_removes_the_others_no_run_used_for_a_day",
        ),
    ),
    Guard(
        name="iceberg-files-synced-before-the-pointer",
        file="src/millstream/table/iceberg.py",
        what="_SyncedOnClose.close: a file of a local deep store written through pyiceberg (a "
        "manifest, the manifest list, metadata.json) is named, once its stream closes, among "
        "the files write_snapshot syncs before it returns, so before the pointer's "
        "compare-and-set names it (a torn metadata.json would stick the view)",
        old="""\
                self._unsynced.append(self._path)  # synced by its writer, with the others
""",
        new="""\
                pass  # MUTATION: left out of the files synced before the pointer moves
""",
        tests=(
            "tests/unit/table/test_staged_files_durable.py::"
            "test_an_iceberg_publishs_files_are_fsynced_before_its_pointer_names_them",
        ),
    ),
    Guard(
        name="new-directory-name-synced",
        file="src/millstream/storage/deepstore.py",
        what="DeepStore._make_durable: a directory whose name this process has not made durable "
        "(one created for the file) has its parent fsynced before the write returns",
        old="""\
            _fsync_dir(dirs[i - 1])
""",
        new="""\
            pass  # MUTATION: a new directory's name left in the page cache
""",
        tests=(
            "tests/unit/table/test_staged_files_durable.py::"
            "test_an_iceberg_publishs_files_are_fsynced_before_its_pointer_names_them",
        ),
    ),
    Guard(
        name="restart-counted-when-the-store-blips",
        file="src/millstream/spark/runner.py",
        what="DatastreamRunner._count_restart: the shard uppers that say whether the writer "
        "committed since its start are read guarded; a store that does not answer reads as no "
        "progress and the fenced writer restarts instead of failing with the store's error",
        old="""\
        except Exception:  # a store that does not answer: no progress seen, still restartable
""",
        new="""\
        except ZeroDivisionError:  # MUTATION: the store's error fails the writer
""",
        tests=(
            "tests/integration/test_restarts_in_a_row.py::"
            "test_a_fenced_writer_restarts_when_its_shard_uppers_cannot_be_read",
        ),
    ),
    Guard(
        name="poll-key-flags-only-within-their-range",
        file=POLL_FILE,
        what="_dense_lookup: a winner's integer key is looked up in the flags over the new "
        "keys' range only if it lies in that range; any other key reads the flag 'not new'",
        old="""\
        outside = (found < lo) | (found > hi)
""",
        new="""\
        outside = found > hi  # MUTATION: a key below the range reads a flag from its end
""",
        tests=(
            f"{POLL_TEST}::test_a_poll_looks_up_keys_below_and_above_the_new_keys_range",
            f"{POLL_TEST}::test_a_cached_poll_reads_what_a_new_uncached_reader_reads",
        ),
    ),
    Guard(
        name="poll-winner-by-neighbours-only-without-null-keys",
        file=POLL_FILE,
        what="_last_of_runs: each key's winner is picked where the sorted key changes only for "
        "an integer key without nulls; a null key (a key of its own) goes to the hash "
        "aggregation",
        old="""\
    if not pa.types.is_integer(key.type) or key.null_count:
""",
        new="""\
    if not pa.types.is_integer(key.type):  # MUTATION: null keys compared as neighbours
""",
        tests=(f"{POLL_TEST}::test_a_null_key_keeps_one_winner_through_a_full_merge_and_a_poll",),
    ),
    Guard(
        name="run-exits-after-closing-the-store",
        file="src/millstream/cli/app.py",
        what="_end_when_done: a finished run --available-now closes the metadata store's "
        "connections (SQLite's write-ahead log into the database file) before it ends the "
        "process with os._exit",
        old="""\
        for close in _WHEN_DONE:
            close()
""",
        new="""\
        for close in _WHEN_DONE:
            pass  # MUTATION: the connections are left open
""",
        tests=(
            "tests/integration/test_cli_run_exit.py::"
            "test_a_finished_run_leaves_its_whole_summary_and_its_commits_in_the_database_file",
        ),
    ),
    Guard(
        name="run-exits-after-flushing-its-summary",
        file="src/millstream/cli/app.py",
        what="_exit_now: the standard streams (the run's summary) are flushed before os._exit",
        old="""\
            stream.flush()
""",
        new="""\
            pass  # MUTATION: what is buffered is lost
""",
        tests=(
            "tests/integration/test_cli_run_exit.py::"
            "test_a_finished_run_leaves_its_whole_summary_and_its_commits_in_the_database_file",
        ),
    ),
    Guard(
        name="run-exits-at-once-only-when-no-thread-works",
        file="src/millstream/cli/app.py",
        what="_end_when_done: a thread still at work (not a daemon, not an idle read pool's "
        "worker) keeps the interpreter's normal exit, which waits for it",
        old="""\
    if busy:
""",
        new="""\
    if False:  # MUTATION: ended under a thread at work
""",
        tests=(
            "tests/unit/test_cli_exit_when_done.py::"
            "test_a_finished_run_ends_at_once_only_when_no_thread_is_still_at_work",
        ),
    ),
    Guard(
        name="iceberg-columns-evicted-with-their-view",
        file="src/millstream/table/iceberg.py",
        what="PublishCache.retain: a table whose merge columns go past the cache's bytes loses "
        "the view it built on too (its next publish reads in full): built on that view, the "
        "next publish would find the files that left the table since neither held nor readable",
        old="""\
                self._views.pop(evicted, None)
""",
        new="""\
                pass  # MUTATION: the view kept without the columns it needs
""",
        tests=(
            "tests/unit/sealing/test_iceberg_publish_blocks.py::"
            "test_a_table_whose_columns_were_evicted_publishes_in_full",
        ),
    ),
    Guard(
        name="iceberg-left-files-rows-never-candidates",
        file="src/millstream/table/iceberg.py",
        what="incremental_view: the rows of files held in the cache's blocks that left the table "
        "since the view a publish builds on (a rollback's, a seal's) lie in no segment of the "
        "new version: none is a candidate of a touched key",
        old="""\
                else np.zeros(n, dtype=bool)
""",
        new="""\
                else np.ones(n, dtype=bool)  # MUTATION: a left file's rows in the version
""",
        tests=(
            "tests/unit/sealing/test_iceberg_publish_blocks.py::"
            "test_views_stay_exact_as_the_blocks_are_rebuilt_joined_and_emptied",
        ),
    ),
    Guard(
        name="viewgc-references-keyed-by-the-deep-store",
        file="src/millstream/table/iceberg.py",
        what="ViewReferences: what a view file references is kept by the deep store (its URI "
        "and root, which the relative paths held depend on) and the file's path, so a copy's "
        "answers never stand for the original's",
        old="""\
        return self._stores.setdefault((deep.uri, location(deep, "")), OrderedDict())
""",
        new="""\
        return self._stores.setdefault(("", ""), OrderedDict())  # MUTATION: by path alone
""",
        tests=(f"{VIEW_GC_TEST}::test_a_copy_of_the_deep_store_does_not_answer_for_the_original",),
    ),
    Guard(
        name="viewgc-expired-snapshots-filtered-after-the-lookup",
        file="src/millstream/table/iceberg.py",
        what="referenced_view_files: the oldest kept version is applied at every collection to "
        "every snapshot, those the references kept for an earlier metadata file included, so "
        "an expired snapshot's files go",
        old="""\
        if snapshot_id < oldest or snapshot_id in seen:
""",
        new="""\
        if snapshot_id in seen:  # MUTATION: expired snapshots kept
""",
        tests=(
            f"{VIEW_GC_TEST}::"
            "test_collections_with_the_references_warm_keep_what_a_cold_collection_keeps",
        ),
        select="sqlite-local",
    ),
    Guard(
        name="viewgc-current-metadata-read-at-every-collection",
        file="src/millstream/table/iceberg.py",
        what="referenced_view_files: the metadata file the pointer names is read at every "
        "collection, never kept: a later collection keeps the snapshots published since",
        old="""\
    current = _metadata_json(deep, pointer.metadata_location)
    keep = {pointer.metadata_location}
""",
        new="""\
    current = referenced_view_files.__dict__.setdefault(  # MUTATION: kept per table
        (deep.uri, table), _metadata_json(deep, pointer.metadata_location)
    )
    keep = {pointer.metadata_location}
""",
        tests=(
            f"{VIEW_GC_TEST}::"
            "test_collections_with_the_references_warm_keep_what_a_cold_collection_keeps",
        ),
        select="sqlite-local",
    ),
    Guard(
        name="sealing-reads-only-after-the-remembered-version",
        file=SEALER_FILE,
        what="_quiet: a worker-wide read of the tables' changes stands in for a pass's own "
        "read only when it was taken after the version the pass remembered; changes after "
        "another version would miss appends (a due run never sealed) or count them twice",
        old="""\
            and prefetched.after == last.version
""",
        new="""\
            and True  # MUTATION: changes after any version
""",
        tests=(
            "tests/unit/sealing/test_sealer.py::"
            "test_a_worker_wide_read_after_another_version_than_the_remembered_one_is_not_used",
        ),
    ),
    Guard(
        name="commit-log-unread-only-at-the-same-size",
        file="src/millstream/spark/runner.py",
        what="CommitLogTotals.update: a log is left unread only while its size (with its "
        "device, inode and modification time) is that of the last read: an append within the "
        "file system's timestamp granularity is still counted",
        old="""\
        seen = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
""",
        new="""\
        seen = (st.st_dev, st.st_ino, 0, st.st_mtime_ns)  # MUTATION: the size not compared
""",
        tests=(
            "tests/unit/api/test_api_metrics.py::"
            "test_a_log_unchanged_since_its_last_read_is_not_opened_and_every_append_is_counted",
        ),
    ),
    Guard(
        name="sealing-reads-failure-leaves-each-pass-its-own",
        file="src/millstream/control/worker.py",
        what="Worker._sealing_reads: a failed read of all the tables' sealing changes leaves "
        "each table's pass to read its own; it does not end the worker's sealing pass (no "
        "table sealed while the store blips)",
        old="""\
        except Exception as exc:  # each pass reads its own (and reports its own failure)
            log.warning("worker %s: cannot read its tables' sealing changes: %s", self.id, exc)
            return {}
""",
        new="""\
        except ZeroDivisionError:  # MUTATION: the failure ends the pass
            return {}
""",
        tests=(
            "tests/unit/control/test_worker_table_pause.py::"
            "test_a_workers_sealing_pass_reads_its_tables_changes_at_once_or_each_on_its_own",
        ),
    ),
    Guard(
        name="iceberg-data-manifest-reused-only-while-all-its-files-live",
        file="src/millstream/table/iceberg.py",
        what="write_snapshot: a previous snapshot's data manifest is listed again only while "
        "every file it lists is still in the new view (after a seal, the manifests naming the "
        "replaced micro-batch files are written again without them)",
        old="""\
        if paths <= entries.keys()
""",
        new="""\
        if True  # MUTATION: a manifest listing files that left the table listed again
""",
        tests=(
            "tests/unit/sealing/test_iceberg_manifest_tiers.py::"
            "test_a_publish_writes_the_entries_of_its_new_files_and_tiers_of_the_rest",
        ),
    ),
    Guard(
        name="iceberg-snapshot-files-synced-before-the-pointer",
        file="src/millstream/table/iceberg.py",
        what="write_snapshot: every file of a snapshot (manifests, delete and merged-row files, "
        "the manifest list, the metadata file), written unsynced, is synced with its directory "
        "before write_snapshot returns, so before the pointer's compare-and-set names it",
        old="""\
    deep.sync_files(unsynced)
""",
        new="""\
    pass  # MUTATION: the pointer may name files still in the page cache
""",
        tests=(
            "tests/unit/table/test_staged_files_durable.py::"
            "test_an_iceberg_publishs_files_are_fsynced_before_its_pointer_names_them",
        ),
    ),
    Guard(
        name="worker-status-written-when-its-writers-change",
        file="src/millstream/control/worker.py",
        what="Worker._beat: a beat writes the whole status at once when its writers or shared "
        "query changed (a writer failing, gone, running), not STATUS_SECONDS later: the "
        "datastream's health and the controller's STOPPING completion read them",
        old="""\
        if whole or reported != self._reported or due:
""",
        new="""\
        if whole or due:  # MUTATION: a writer's change waits its turn
""",
        tests=(
            "tests/unit/api/test_worker_status_beat.py::"
            "test_a_beat_writes_liveness_always_a_writers_change_at_once_and_counters_within_the_interval",
        ),
    ),
    Guard(
        name="worker-status-written-within-the-status-interval",
        file="src/millstream/control/worker.py",
        what="Worker._beat: the whole status (sealing, loops, maintenance, row counters) is "
        "written again STATUS_SECONDS after the last write, not only when the writers change: "
        "the metrics and debugInfo go stale otherwise",
        old="""\
        if whole or reported != self._reported or due:
""",
        new="""\
        if whole or reported != self._reported:  # MUTATION: counters written with writers only
""",
        tests=(
            "tests/unit/api/test_worker_status_beat.py::"
            "test_a_beat_writes_liveness_always_a_writers_change_at_once_and_counters_within_the_interval",
        ),
    ),
    Guard(
        name="worker-liveness-beat-keeps-the-stored-status",
        file="src/millstream/metastore/workers.py",
        what="heartbeat: a liveness beat (info None) updates the status and the heartbeat time "
        "and leaves the stored status as it is, not emptied",
        old="""\
        if info is not None:
            values["info"] = info
""",
        new="""\
        values["info"] = info  # MUTATION: a liveness beat writes its empty status
""",
        tests=(
            "tests/unit/api/test_worker_status_beat.py::"
            "test_a_beat_writes_liveness_always_a_writers_change_at_once_and_counters_within_the_interval",
        ),
    ),
    Guard(
        name="worker-table-sealer-loops-listed-for-readers",
        file="src/millstream/control/workers.py",
        what="list_workers: each table's sealer loop, stored once under sealing, is put back in "
        "loops for GET /workers, the console and millstream_background_errors_total",
        old="""\
    return [dataclasses.replace(w, info=with_table_loops(w.info)) for w in found]
""",
        new="""\
    return found  # MUTATION: the tables' sealer loops missing from loops
""",
        tests=(
            "tests/unit/api/test_worker_status_beat.py::"
            "test_a_beat_writes_liveness_always_a_writers_change_at_once_and_counters_within_the_interval",
            "tests/unit/api/test_api_background_loops.py::"
            "test_a_failing_sealing_pass_backs_off_its_table_only_and_is_shown_in_metrics_and_debug_info",
        ),
    ),
    Guard(
        name="manifest-read-live-entries-added-by-its-version",
        file="src/millstream/metastore/reads.py",
        what="manifest_at (_LIVE_AT): of the entries live now, a read at an older version sees "
        "only those added at or before it, not the entries committed since",
        old="""\
        _e.c.removed_version.is_(None),
        _e.c.added_version + literal_column("0") <= bindparam("version"),
""",
        new="""\
        _e.c.removed_version.is_(None),  # MUTATION: entries added after the version too
""",
        tests=(
            "tests/unit/metastore/test_manifest_reads_at_every_version.py::"
            "test_every_version_reads_the_entries_the_old_statement_read[sqlite]",
        ),
    ),
    Guard(
        name="manifest-read-removed-entries-added-by-its-version",
        file="src/millstream/metastore/reads.py",
        what="manifest_at (_LIVE_AT): of the entries removed after its version, a read sees only "
        "those added at or before it, not entries both added and removed since (a sealed run)",
        old="""\
        _e.c.removed_version > bindparam("version"),
        _e.c.added_version + literal_column("0") <= bindparam("version"),
""",
        new="""\
        _e.c.removed_version > bindparam("version"),  # MUTATION: added since too
""",
        tests=(
            "tests/unit/metastore/test_manifest_reads_at_every_version.py::"
            "test_every_version_reads_the_entries_the_old_statement_read[sqlite]",
        ),
    ),
    Guard(
        name="viewgc-snapshots-shared-only-when-equal",
        file="src/millstream/table/iceberg.py",
        what="ViewReferences._stretch: an earlier metadata file's snapshots are held as a "
        "stretch of the view's history only when its ids and manifest lists are exactly that "
        "stretch (a metadata store restored from a backup publishes versions again with other "
        "manifest lists, which the stretch of the earlier ones would hide from collection)",
        old="""\
                and history.ids[start : start + shared] == ids[:shared]
                and history.lists[start : start + shared] == lists[:shared]
""",
        new="""\
                and True  # MUTATION: any list whose first id is known is that stretch
""",
        tests=(
            f"{VIEW_GC_TEST}::"
            "test_metadata_files_listing_the_same_ids_with_other_manifest_lists_keep_their_own",
        ),
    ),
    Guard(
        name="full-view-holds-places-not-rows",
        file="src/millstream/table/iceberg.py",
        what="version_view: a view computed in full of a table whose engine does not merge "
        "columns reads the winners' merge columns and each data file's (partition, offset) "
        "only, not every column of the table twice (a 10M-key publisher held 5.35 GB)",
        old="""\
    rows_kept = engine_for(spec).merges_columns
""",
        new="""\
    rows_kept = True  # MUTATION: every column of the read and of every data file held
""",
        tests=(
            "tests/unit/sealing/test_iceberg_full_view_memory.py::"
            "test_a_first_publish_of_an_upsert_table_holds_no_copy_of_its_rows",
        ),
    ),
    Guard(
        name="seal-lets-its-run-go-once-compacted",
        file="src/millstream/sealing/sealer.py",
        what="seal_partition: the run's rows are let go once compacted, before the sealed "
        "file's encoding and the key index's lookup (else a seal holds its input beside its "
        "output: 3.6 copies of the run at its peak against 2.8)",
        old="""\
            del rows, floor
""",
        new="""\
            pass  # MUTATION: the run's rows held to the end of the seal
""",
        tests=(
            "tests/unit/sealing/test_seal_memory.py::"
            "test_a_seal_holds_its_run_and_its_sealed_rows_at_most_about_three_times",
        ),
    ),
    Guard(
        name="worker-gives-back-a-large-task",
        file="src/millstream/spark/sources.py",
        what="release_after_task: a worker whose RSS grew past RELEASE_GROWTH_BYTES gives the "
        "Arrow pool's and glibc's free pages back (else a reused worker holds its largest "
        "task's high-water mark to the end of the run: ~140 MB a catch-up task)",
        old="""\
    release_freed_memory()
    _rss_floor = _rss_bytes()
""",
        new="""\
    _rss_floor = _rss_bytes()  # MUTATION: nothing given back
""",
        tests=(
            "tests/unit/ingest/test_worker_gives_back_a_large_task.py::"
            "test_a_large_write_task_gives_its_memory_back_and_small_ones_release_nothing",
        ),
    ),
    Guard(
        name="catch-up-batch-decodes-under-the-spec-read-for-it",
        file="src/millstream/spark/catch_up.py",
        what="catch_up: each batch's tasks decode under the table's spec as the driver read it "
        "once the batch was planned (a task no longer reads it): a column added while an "
        "available-now run goes on reaches its next batch",
        old="""\
            spec = committer.current_spec()
""",
        new="""\
            spec = writer.spec  # MUTATION: the spec the run started with
""",
        tests=(
            "tests/integration/test_available_now_jobs.py::"
            "test_each_batch_of_a_run_decodes_under_the_spec_read_for_it",
        ),
    ),
    Guard(
        name="an-available-now-run-is-never-held-by-the-interval",
        file="src/millstream/spark/sources.py",
        what="StreamReader.due: a reader whose target is pinned (an available-now run, "
        "catch_up) plans at every ask, whatever its trigger interval: held to one plan per "
        "interval, the run's second plan would be empty and the run would end with its "
        "backlog uningested",
        old="""\
        if self._target is not None or every <= 0 or last is None:
""",
        new="""\
        if every <= 0 or last is None:  # MUTATION: an available-now run held by the interval
""",
        tests=(
            "tests/unit/ingest/test_trigger_tick.py::"
            "test_an_available_now_run_is_never_held_by_the_interval",
        ),
    ),
    Guard(
        name="idle-tick-skips-only-an-answer-of-exactly-its-start",
        file="src/millstream/spark/sources.py",
        what="GroupStreamReader.latestOffset leaves a due member unplanned only when its "
        "source answered exactly its start: an answer with nothing past the start but a "
        "partition gained (or one rewound below it) is planned, or a partition found while its "
        "member idles is never planned (its records never read) and a rewound one never refused",
        old="""\
    return reader._target is None and isinstance(got, dict) and got == decode_offsets(start)
""",
        new="""\
    return (  # MUTATION: "nothing past its start" taken for "answered exactly its start"
        reader._target is None
        and isinstance(got, dict)
        and all(o <= decode_offsets(start).get(p, o) for p, o in got.items())
    )
""",
        tests=(
            "tests/unit/ingest/test_shared_query_new_partitions.py::"
            "test_a_member_starting_empty_reads_every_record_of_a_partition_found_later",
            "tests/integration/test_kafka_offsets_rewound.py::"
            "test_a_broker_restarted_empty_stops_the_partition_naming_both_offsets",
        ),
    ),
    Guard(
        name="iceberg-publish-files-young-enough-at-the-swap",
        file="src/millstream/table/iceberg.py",
        what="publish: the pointer's swap refuses, right before its COMMIT, a snapshot whose "
        "first file was written longer ago than MAX_PUBLISH_AGE_SECONDS (below the view GC's "
        "smallest grace): a publisher stalled between its writes and the swap past the grace "
        "would point every reader at files a collection deleted meanwhile",
        old="""\
            precondition=young_enough,
""",
        new="""\
            precondition=None,  # MUTATION: a stalled publish swaps in files of any age
""",
        tests=(
            "tests/contract/test_contract_iceberg_view.py::"
            "test_a_publish_stalled_past_gcs_grace_before_its_swap_moves_no_pointer",
        ),
        select="sqlite-local",
    ),
)


# -- the copy --------------------------------------------------------------------------------


def copy_repo(dest: Path) -> None:
    """Copy the tracked and untracked-but-not-ignored files (no ``.venv``) into ``dest``."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout
    for raw in listed.split(b"\0"):
        rel = os.fsdecode(raw)
        if not rel or rel == ".venv" or rel.startswith(".venv/"):
            continue
        src = REPO / rel
        if not src.exists() and not src.is_symlink():
            continue  # tracked but deleted in the working tree
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target, follow_symlinks=False)


def env_for(copy: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(copy / "src")
    # No bytecode: a .pyc written by the unmutated run must never stand in for the mutant.
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def check_shadowing(copy: Path) -> None:
    """The copy's ``millstream`` is the one imported, not the editable install's."""
    out = subprocess.run(
        [str(PYTHON), "-c", "import millstream, sys; print(millstream.__file__)"],
        cwd=copy,
        env=env_for(copy),
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not Path(out).resolve().is_relative_to(copy.resolve()):
        raise SystemExit(f"the copy at {copy} imports millstream from {out}, not from the copy")


class NotAppliedError(Exception):
    """The mutation cannot be applied: the list of guards has rotted."""


def mutated(copy: Path, guard: Guard) -> str:
    """The guard's file in ``copy`` with the mutation applied (nothing is written yet); it
    must still compile."""
    path = copy / guard.file
    if not path.is_file():
        raise NotAppliedError(f"{guard.file} does not exist")
    text = path.read_text()
    count = text.count(guard.old)
    if count != 1:
        raise NotAppliedError(
            f"the mutation's old text occurs {count} times in {guard.file} (expected once)"
        )
    text = text.replace(guard.old, guard.new)
    try:
        compile(text, guard.file, "exec")
    except SyntaxError as exc:
        raise NotAppliedError(f"the mutated {guard.file} does not compile: {exc}") from exc
    return text


@dataclass(frozen=True, slots=True)
class Run:
    #: pytest's exit status (1: tests failed), -1 on timeout
    status: int
    seconds: float
    #: the output's last lines
    tail: str
    #: pytest's last line, ``3 passed, 1 deselected in 2.1s``
    summary: str


def run_tests(copy: Path, guard: Guard) -> Run:
    """Run the guard's tests in ``copy``."""
    cmd = [str(PYTHON), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *guard.tests]
    if guard.select is not None:
        cmd += ["-k", guard.select]
    started = time.monotonic()
    try:
        proc = subprocess.run(
            cmd,
            cwd=copy,
            env=env_for(copy),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        took = time.monotonic() - started
        return Run(-1, took, f"timed out after {RUN_TIMEOUT:.0f}s", "")
    took = time.monotonic() - started
    out = proc.stdout.strip().splitlines()
    # pytest's "E " lines (the assertion and its message) come before the captured output,
    # which can be long (a campaign's log): keep them, or a BROKEN run does not say why.
    errors = [line for line in out if line.startswith("E ")][:20]
    tail = "\n".join(errors + out[-25:] + proc.stderr.strip().splitlines()[-10:])
    return Run(proc.returncode, took, tail, out[-1] if out else "")


# -- one guard -------------------------------------------------------------------------------


def check(guard: Guard) -> Result:
    if guard.skip is not None:
        return Result(guard, "SKIPPED", 0.0, detail=guard.skip)
    with tempfile.TemporaryDirectory(prefix=f"mutation-{guard.name}-") as tmp:
        copy = Path(tmp)
        copy_repo(copy)
        check_shadowing(copy)
        try:
            text = mutated(copy, guard)  # before any test runs: the list must not rot
        except NotAppliedError as exc:
            return Result(guard, "NOT APPLIED", 0.0, detail=str(exc))
        base = run_tests(copy, guard)
        if base.status != 0 or " passed" not in base.summary or "skipped" in base.summary:
            why = f"unmutated: exit {base.status} (every test must run and pass)"
            return Result(guard, "BROKEN", 0.0, base.seconds, f"{why}\n{base.tail}")
        (copy / guard.file).write_text(text)
        run = run_tests(copy, guard)
    verdict = {1: "KILLED", 0: "SURVIVED"}.get(run.status, "ERROR")
    detail = "" if run.status == 1 else f"exit {run.status}\n{run.tail}"
    return Result(guard, verdict, run.seconds, base.seconds, detail)


# -- reporting -------------------------------------------------------------------------------


def tests_label(guard: Guard) -> str:
    label = " ".join(guard.tests)
    return label if guard.select is None else f"{label} -k {guard.select!r}"


def print_table(results: Sequence[Result]) -> None:
    width = max(len(r.guard.name) for r in results)
    print(f"\n{'guard':<{width}}  {'verdict':<11}  {'seconds':>7}  {'baseline':>8}  file")
    for r in results:
        print(
            f"{r.guard.name:<{width}}  {r.verdict:<11}  {r.seconds:>7.1f}  "
            f"{r.baseline_seconds:>8.1f}  {r.guard.file}"
        )


def markdown(results: Sequence[Result]) -> str:
    lines = [
        "| # | guard | file | tests | verdict | seconds |",
        "|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(results, 1):
        tests = "<br>".join(f"`{t}`" for t in r.guard.tests)
        if r.guard.select is not None:
            tests += f"<br>`-k {r.guard.select!r}`"
        lines.append(
            f"| {i} | `{r.guard.name}`: {r.guard.what} | `{r.guard.file}` | {tests} | "
            f"{r.verdict} | {r.seconds:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--list", action="store_true", help="list the guards and exit")
    parser.add_argument(
        "--only", action="append", metavar="NAME", help="check only this guard (repeatable)"
    )
    parser.add_argument("--markdown", type=Path, metavar="PATH", help="write the table here")
    args = parser.parse_args(argv)

    guards = list(GUARDS)
    if args.only:
        unknown = set(args.only) - {g.name for g in GUARDS}
        if unknown:
            parser.error(f"unknown guard(s): {', '.join(sorted(unknown))} (see --list)")
        guards = [g for g in GUARDS if g.name in args.only]
    if args.list:
        for i, g in enumerate(GUARDS, 1):
            print(f"{i:2}. {g.name}  ({g.file})\n    {g.what}\n    tests: {tests_label(g)}")
        return 0
    if not PYTHON.exists():
        parser.error(f"no interpreter at {PYTHON}")

    started = time.monotonic()
    results: list[Result] = []
    for i, g in enumerate(guards, 1):
        print(f"[{i}/{len(guards)}] {g.name} ({g.file}) ...", flush=True)
        r = check(g)
        results.append(r)
        print(f"    {r.verdict} in {r.seconds:.1f}s (unmutated {r.baseline_seconds:.1f}s)")
        if r.detail and r.verdict != "KILLED":
            print("    " + r.detail.replace("\n", "\n    "), flush=True)
    print_table(results)
    total = time.monotonic() - started
    print(f"\ntotal {total:.0f}s; guards and their tests: {GUARDS_DOC}")
    if args.markdown is not None:
        args.markdown.write_text(markdown(results))
        print(f"wrote {args.markdown}")
    bad = [r for r in results if r.verdict not in ("KILLED", "SKIPPED")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
