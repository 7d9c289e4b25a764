"""The deep store on a local directory and on S3: paths are relative to the root."""

from __future__ import annotations

import pyarrow as pa
import pytest

from harness.servers import MotoS3Server
from millstream.errors import InvalidSpecError
from millstream.storage.deepstore import DeepStore

DATA = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]})


def test_written_parquet_reads_back_and_is_listed_with_its_size(deep_store: DeepStore) -> None:
    size = deep_store.write_parquet("tables/t/data/one.parquet", DATA)

    assert deep_store.exists("tables/t/data/one.parquet")
    assert deep_store.read_parquet("tables/t/data/one.parquet").equals(DATA)
    assert deep_store.read_parquet("tables/t/data/one.parquet", columns=["v"]).equals(
        DATA.select(["v"])
    )
    (listed,) = deep_store.list_files("tables/t")
    assert (listed.path, listed.size) == ("tables/t/data/one.parquet", size)
    assert size > 0
    assert listed.mtime is not None


def test_list_files_is_recursive_relative_and_limited_to_the_prefix(
    deep_store: DeepStore,
) -> None:
    for path in ("tables/a/data/1.parquet", "tables/a/data/x/2.parquet", "tables/b/data/3.parquet"):
        deep_store.write_parquet(path, DATA)

    assert sorted(f.path for f in deep_store.list_files("tables/a")) == [
        "tables/a/data/1.parquet",
        "tables/a/data/x/2.parquet",
    ]
    assert len(deep_store.list_files("tables")) == 3
    assert deep_store.list_files("tables/missing") == []


def test_delete_removes_a_file_and_deleting_a_missing_file_is_a_no_op(
    deep_store: DeepStore,
) -> None:
    deep_store.write_parquet("tables/t/data/gone.parquet", DATA)
    deep_store.write_parquet("tables/t/data/kept.parquet", DATA)

    deep_store.delete("tables/t/data/gone.parquet")
    deep_store.delete("tables/t/data/gone.parquet")
    deep_store.delete("tables/t/data/never-existed.parquet")

    assert not deep_store.exists("tables/t/data/gone.parquet")
    assert [f.path for f in deep_store.list_files("tables/t")] == ["tables/t/data/kept.parquet"]


def test_reading_a_missing_file_raises_file_not_found(deep_store: DeepStore) -> None:
    with pytest.raises(FileNotFoundError):
        deep_store.read_parquet("tables/t/data/missing.parquet")


@pytest.mark.parametrize("path", ["../escape.parquet", "tables/../../x.parquet", "/abs.parquet"])
def test_paths_escaping_the_root_are_rejected(deep_store: DeepStore, path: str) -> None:
    with pytest.raises(InvalidSpecError) as info:
        deep_store.write_parquet(path, DATA)
    assert info.value.field == "path"
    with pytest.raises(InvalidSpecError):
        deep_store.read_parquet(path)
    with pytest.raises(InvalidSpecError):
        deep_store.delete(path)


@pytest.mark.s3
def test_s3_files_land_under_the_bucket_prefix(moto_server: MotoS3Server) -> None:
    moto_server.create_bucket("ms-prefix-check")
    deep = DeepStore.from_uri("s3://ms-prefix-check/some/root/", s3_endpoint=moto_server.endpoint)

    deep.write_parquet("tables/t/data/f.parquet", DATA)

    listing = moto_server.client().list_objects_v2(Bucket="ms-prefix-check")
    keys = [o["Key"] for o in listing.get("Contents", [])]
    assert "some/root/tables/t/data/f.parquet" in keys
    assert [f.path for f in deep.list_files("tables")] == ["tables/t/data/f.parquet"]


@pytest.mark.parametrize(
    ("uri", "field"),
    [("s3:///no-bucket", "deep_store"), ("ftp://host/dir", "deep_store")],
)
def test_a_deep_store_uri_without_bucket_or_with_an_unknown_scheme_is_invalid(
    uri: str, field: str
) -> None:
    with pytest.raises(InvalidSpecError) as info:
        DeepStore.from_uri(uri)
    assert info.value.field == field
