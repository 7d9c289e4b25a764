"""A sealed file dictionary-encodes only the columns a dictionary makes smaller: a column of
mostly distinct values (keys, offsets, timestamps) is written plain, where zstd packs it into
about half the bytes, and reads back faster; a column of few values keeps its dictionary."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from millstream.catalog import Catalog
from millstream.sealing.compaction import CompactionPolicy
from millstream.sealing.keyindex import IndexCache
from millstream.sealing.sealer import Sealer
from millstream.spec import TableSpec
from millstream.storage.deepstore import dictionary_columns
from millstream.table.writer import commit_staged, stage_rows

N = 20_000


def _encodings(path: Path) -> dict[str, tuple[str, ...]]:
    group = pq.ParquetFile(path).metadata.row_group(0)
    return {
        group.column(i).path_in_schema: group.column(i).encodings for i in range(group.num_columns)
    }


def test_a_sealed_file_is_dictionary_encoded_only_where_the_dictionary_pays(
    tmp_path: Path,
) -> None:
    with Catalog.open(home=tmp_path) as cat:
        spec = cat.create_table(
            TableSpec.parse(
                {
                    "name": "t",
                    "schema": {"k": "long", "status": "string", "at": "timestamp"},
                    "primary_key": ["k"],
                    "mode": "upsert",
                }
            )
        ).spec
        rows = pa.Table.from_pylist(
            [
                {
                    "k": 7 * i,
                    "status": ("new", "paid", "sent")[i % 3],
                    "at": 1_700_000_000_000_000 + 13 * i,
                    "_ms_partition": 0,
                    "_ms_offset": i,
                    "_ms_tombstone": False,
                }
                for i in range(N)
            ],
            schema=spec.arrow_schema(system_columns=True),
        )
        staged = stage_rows(cat.deep, spec, rows)
        commit_staged(cat.store, cat.deep, "t", staged, {0: (0, N)}, {})
        before = cat.read_table("t")
        sealer = Sealer(
            cat, "t", index_cache=IndexCache(), compaction=CompactionPolicy(enabled=False)
        )
        assert sealer.seal_partition(0, force=True) is not None
        (entry,) = cat.manifest("t").entries
        assert entry.file_path is not None and entry.file_path.split("/")[-1].startswith("sealed")
        sealed = Path(cat.deep.root) / entry.file_path
        encodings = _encodings(sealed)
        dictionary = {"RLE_DICTIONARY", "PLAIN_DICTIONARY"}
        for column in ("k", "at", "_ms_offset"):  # every value distinct
            assert not dictionary & set(encodings[column]), (column, encodings[column])
        for column in ("status", "_ms_partition"):  # three values, one value
            assert dictionary & set(encodings[column]), (column, encodings[column])
        # What the user sees: a smaller file, and the same rows.
        everywhere = tmp_path / "dictionary-everywhere.parquet"
        pq.write_table(pq.read_table(sealed), everywhere, compression="zstd")
        assert sealed.stat().st_size < 0.8 * everywhere.stat().st_size
        assert cat.read_table("t").sort_by("k").equals(before.sort_by("k"))


def test_which_columns_get_a_dictionary() -> None:
    table = pa.table(
        {
            "half": [1, 1, 2, 2],  # 2 distinct of 4: pays
            "most": [1, 2, 3, 3],  # 3 of 4: does not
            "nulls": pa.array([None, None, None, 1], pa.int64()),
        }
    )
    assert dictionary_columns(table) == ["half", "nulls"]
    assert dictionary_columns(table.slice(0, 0)) == ["half", "most", "nulls"]
    nested = table.append_column("s", pa.array([{"a": 1}] * 4))
    assert dictionary_columns(nested) is True  # leaves are paths: pyarrow's default
