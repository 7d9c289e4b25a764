"""A Spark Python worker gives back what a large write task freed (a catch-up's batch) at the
end of that task, and the small tasks after it release nothing: a reused worker otherwise held
its largest task's high-water mark in its allocators' free pages to the end of the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "src"

#: A fresh process, as a forked worker is, runs the write task Spark calls (``write``) over a
#: files source: a small task, a large one, then small ones again.
CHILD = textwrap.dedent(
    """
    import json
    import sys
    from pathlib import Path

    from millstream.catalog import Catalog
    from millstream.spark import sources
    from millstream.spark.options import SinkOptions
    from millstream.spark.sink import SegmentSink
    from millstream.spark.sources import markers_batch
    from millstream.spec import TableSpec

    root, per = Path(sys.argv[1]), int(sys.argv[2])
    spec = TableSpec.parse({
        "name": "t", "schema": {"id": "long", "v": "string", "w": "double"},
        "mode": "upsert", "primary_key": ["id"],
    })

    def status(field):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise LookupError(field)

    with Catalog.open(home=root / "home") as cat:
        cat.create_table(spec)
        for p in range(4):
            (root / "src" / str(p)).mkdir(parents=True)
            with open(root / "src" / str(p) / "a.json", "w") as f:
                for i in range(per):
                    row = {"id": p * per + i, "v": f"value-{i}-" + "x" * 60, "w": i * 0.5}
                    f.write(json.dumps(row) + "\\n")
        sink = SegmentSink(SinkOptions.from_options({
            **cat.settings.as_options(), "table": "t",
            "tableSpec": json.dumps(spec.to_json_dict()), "sourceKind": "files",
            "sourceConfig": json.dumps({"path": str(root / "src")}),
        }))
        small = markers_batch([(p, 0, 10) for p in range(4)])
        sink.write(iter([small]))
        floor = sources._rss_floor
        large = sink.write(iter([markers_batch([(p, 0, per) for p in range(4)])]))
        after_large = status("VmRSS")
        released_by_large = sources.releases
        for _ in range(5):
            sink.write(iter([small]))
        print(json.dumps({
            "floor": floor, "peak": status("VmHWM"), "after_large": after_large,
            "released_by_large": released_by_large, "releases": sources.releases,
            "rows": sum(large.data_counts.values()),
        }))
    """
)


def test_a_large_write_task_gives_its_memory_back_and_small_ones_release_nothing(
    tmp_path: Path,
) -> None:
    per = 100_000
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ARROW_", "MALLOC_"))}
    env["PYTHONPATH"] = str(SRC)  # Arrow's default pool (mimalloc), as a streaming worker's
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), str(per)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )

    got = json.loads(out.stdout.strip().splitlines()[-1])
    mb = 1 << 20
    assert got["rows"] == 4 * per  # the large task did its work
    assert got["peak"] - got["floor"] > 100 * mb, "the task held a lot at its peak"
    # without the release the worker kept ~130 MB above where it started (mimalloc's and
    # glibc's free pages); with it, about what the process keeps for good
    assert got["after_large"] - got["floor"] < 48 * mb
    assert got["released_by_large"] == 1
    assert got["releases"] == 1, "the small tasks after it pay no release"
