"""The test harness: test servers (:mod:`.servers`: PostgreSQL, moto's S3), the end-to-end
cluster runner (:mod:`.cluster`), an in-process schema registry (:mod:`.schema_registry`),
record encoders (:mod:`.formats`), the seeded fault campaigns (:mod:`.chaos`, ``make
chaos``), and the helpers the test suites share (:mod:`.contract_support`,
:mod:`.ingest_support`, :mod:`.api_support`, :mod:`.iceberg_readers`). Test code: it needs the test extras and is not in the wheel. The tests import it as
``harness`` (``tests/`` is on ``sys.path``: its conftest.py is the rootdir's), the benchmarks
through ``bench/common.py``. The reference semantics the engines are held to are product:
:mod:`millstream.reference`."""
