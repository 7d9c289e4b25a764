"""The web console (``/ui``) in a real headless Chromium, driven by Selenium, against a real
uvicorn server over a real catalog: a READY datastream whose table has committed segments (one
in ERROR), a datastream in ERROR, and a worker heartbeat with its writers and a failing loop.
Every page shows what an operator looks for, the page makes no request off 127.0.0.1 and logs
no JavaScript error, and pausing through the console needs the token and pauses the datastream.

Screenshots of each page go to ``tmp_path``, or to ``$MILLSTREAM_SCREENSHOTS`` (the README's
and docs/operations.md's ``docs/img/console-*.png`` are made with
``MILLSTREAM_SCREENSHOTS=docs/img``)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from harness.api_support import (
    TOKEN,
    beat,
    ingest_range,
    run_failing_writer,
    serve,
    spec_body,
    write_lines,
)
from millstream.api import create_app
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.controller import Controller
from millstream.control.registry import Registry
from millstream.control.workers import heartbeat
from millstream.core.lifecycle import State
from millstream.datastream import DatastreamSpec
from millstream.errors import SegmentUnavailableError
from millstream.ingest.sources.kafka import CONSUMERS
from millstream.metastore.models import ShardAppend
from millstream.sealing.sealer import Sealer

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WAIT = 20  # seconds WebDriverWait gives the page (it refreshes every 2 s)


@pytest.fixture
def clock() -> ManualClock:
    """The store's and the API's clock, near the browser's wall clock so ages read true."""
    return ManualClock(time.time() - 3)  # the cluster fixture advances it 3 s


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(
            f"the web console's browser test needs Chromium and its driver; missing: "
            f"{', '.join(missing)}. Run `make system-deps` (as root it installs chromium and "
            "chromium-driver)",
            pytrace=False,
        )
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _commit(catalog: Catalog, partition: int, lo: int, hi: int) -> None:
    catalog.store.compare_and_append(
        "orders",
        [ShardAppend(partition, lo, hi, 0, f"data/orders/{partition}-{lo}.parquet", hi - lo, 4096)],
        writer_id="worker-a",
        batch_id=0,
    )


@pytest.fixture
def cluster(
    catalog: Catalog, controller: Controller, clock: ManualClock, source_dir: Path
) -> Registry:
    """``orders`` READY on a files source (partition 0: 40 records upstream, 30 committed in
    three segments, the first in ERROR after two failed seals; partition 1: 12 upstream, all
    committed), ``clicks`` in ERROR, and worker-a heartbeating with their writers and a
    failing maintainer loop."""
    registry = Registry(catalog.store, clock=clock)
    write_lines(source_dir, 0, 40)
    write_lines(source_dir, 1, 12)
    registry.create(DatastreamSpec.parse(spec_body("orders", source_dir)))
    registry.create(
        DatastreamSpec.parse(spec_body("clicks", source_dir / "clicks", bad_records="fail"))
    )
    beat(catalog, clock, "worker-a", "orders", "clicks")
    controller.tick()
    for lo, hi in ((0, 10), (10, 20), (20, 30)):
        _commit(catalog, 0, lo, hi)
    _commit(catalog, 1, 0, 12)
    # The entries have no files: two failed seals put partition 0's first segment in ERROR.
    sealer = Sealer(catalog, "orders", max_failures=2)
    for _ in range(2):
        with pytest.raises(SegmentUnavailableError):
            sealer.seal_partition(0, force=True)
    registry.fail("clicks", "bad record at partition 0 offset 7: amount is not a double")
    clock.advance(3.0)
    heartbeat(
        catalog.store,
        "worker-a",
        status="RUNNING",
        url="http://127.0.0.1:8601",
        info={
            "writers": [
                {"datastream": "orders", "role": "active", "running": True, "error": None},
                {"datastream": "clicks", "role": "active", "running": False, "error": None},
            ],
            "loops": [
                {
                    "loop": "maintainer",
                    "table": "orders",
                    "alive": True,
                    "runs": 3,
                    "errors": 2,
                    "consecutive_failures": 2,
                    "last_error": "OSError: deep store not writable",
                    "last_error_at": clock.now() - 1,
                    "last_success_at": clock.now() - 600,
                    "next_attempt_at": clock.now() + 30,
                }
            ],
        },
        clock=clock,
    )
    return registry


@pytest.fixture
def console(
    cluster: Registry, catalog: Catalog, controller: Controller, clock: ManualClock
) -> Iterator[str]:
    """The console's base URL on a real server that requires the bearer token."""
    app = create_app(catalog, controller=controller, clock=clock, api_token=TOKEN)
    with serve(app) as url:
        yield url


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    target = os.environ.get("MILLSTREAM_SCREENSHOTS")
    out = Path(target) if target else tmp_path / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    return out


def _text_of(driver: WebDriver, css: str) -> str:
    try:
        return " ".join(e.text for e in driver.find_elements(By.CSS_SELECTOR, css))
    except StaleElementReferenceException:  # re-rendered under us: read again next poll
        return ""


def wait_text(driver: WebDriver, css: str, *needles: str) -> str:
    """Wait until the elements matching ``css`` show every needle; their text."""
    seen: list[str] = [""]

    def shown(d: Any) -> bool:
        seen[0] = _text_of(d, css)
        return all(n in seen[0] for n in needles)

    try:
        WebDriverWait(driver, WAIT, poll_frequency=0.2).until(shown)
    except Exception as exc:
        raise AssertionError(f"{css} never showed {needles}; it shows: {seen[0]!r}") from exc
    return seen[0]


def click(driver: WebDriver, css: str) -> None:
    def clicked(d: Any) -> bool:
        try:
            d.find_element(By.CSS_SELECTOR, css).click()
            return True
        except StaleElementReferenceException:
            return False

    WebDriverWait(driver, WAIT, poll_frequency=0.2).until(clicked)


def page_logs(driver: WebDriver, base: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The browser console's errors and the URL of every request since the last call."""
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return errors, urls


def assert_offline(urls: list[str]) -> None:
    assert urls, "no request was seen"
    off = [u for u in urls if not u.startswith("data:") and urlsplit(u).hostname != "127.0.0.1"]
    assert not off, f"requests to other hosts: {off}"


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:  # a dash before the second sample
        return 0.0


def samples(driver: WebDriver) -> int:
    """How many polls the table page's live chart holds."""
    try:
        chart = driver.find_element(By.CSS_SELECTOR, "svg.chart")
        return int(chart.get_attribute("data-samples") or 0)
    except (StaleElementReferenceException, NoSuchElementException):
        return 0


def test_every_page_shows_the_cluster_without_errors_or_outside_requests(
    browser: WebDriver,
    console: str,
    shots: Path,
    catalog: Catalog,
    clock: ManualClock,
    source_dir: Path,
) -> None:
    page_logs(browser, console)  # drop what an earlier test left
    browser.get(console + "/")  # / redirects to the console
    assert urlsplit(browser.current_url).path == "/ui/"

    ds = wait_text(browser, "#datastream-list", "orders", "READY", "clicks", "ERROR")
    assert "amount is not a double" in ds  # the ERROR datastream's last error
    assert "controller-1 (leader)" in wait_text(browser, "#health", "controller-1")
    pause = browser.find_element(
        By.CSS_SELECTOR, 'tr[data-datastream="orders"] [data-action=pause]'
    )
    resume = browser.find_element(
        By.CSS_SELECTOR, 'tr[data-datastream="orders"] [data-action=resume]'
    )
    assert pause.is_enabled() and not resume.is_enabled()  # READY: pause, not resume
    browser.save_screenshot(str(shots / "console-datastreams.png"))

    browser.get(console + "/ui/#/tables/orders")
    parts = wait_text(browser, 'tr[data-partition="0"]', "30", "40", "10")
    assert parts.split()[:4] == ["0", "30", "40", "10"]  # shard upper, latest offset, lag
    assert wait_text(browser, 'tr[data-partition="1"]', "12").split()[:4] == ["1", "12", "12", "0"]
    assert "worker-a (active, running)" in parts
    segments = wait_text(browser, "section", "orders__0__0", "ERROR", "orders__0__2", "CONSUMING")
    assert "orders__1__0" in segments
    assert "Segments in ERROR" in segments and "millstream reingest orders__0__0" in segments
    assert "compaction on (4 segments at a time)" in segments
    # Ingestion goes on while the page is open: the live chart and the figures follow it.
    for upper in (40, 50, 60):
        write_lines(source_dir, 0, 10)
        _commit(catalog, 0, upper - 10, upper)
        clock.advance(1.0)
        row = wait_text(browser, 'tr[data-partition="0"]', f"0 {upper} {upper + 10} 10")
    assert row.split()[:4] == ["0", "60", "70", "10"]  # shard upper, latest offset, lag
    # rows/s committed (averaged over 10 s) shows the shard uppers advancing
    WebDriverWait(browser, WAIT).until(lambda d: _number(_text_of(d, "#rate")) > 0)
    assert samples(browser) >= 4
    browser.save_screenshot(str(shots / "console-table.png"))

    browser.get(console + "/ui/#/workers")
    workers = wait_text(browser, 'tr[data-worker="worker-a"]', "worker-a", "alive")
    assert "orders: active" in workers and "clicks: active" in workers
    assert "orders (active, running)" in workers
    assert "maintainer of orders: failing (2 in a row): OSError: deep store not writable" in workers
    browser.save_screenshot(str(shots / "console-workers.png"))

    browser.get(console + "/ui/#/errors")
    errors = wait_text(browser, "#page", "datastream clicks (ERROR)", "segment orders__0__0")
    assert "amount is not a double" in errors
    assert "millstream datastream resume clicks" in errors  # the operator's action
    assert "millstream reingest orders__0__0" in errors
    assert "maintainer of table orders on worker worker-a" in errors
    assert "deep store not writable" in errors
    browser.save_screenshot(str(shots / "console-errors.png"))

    browser.get(console + "/ui/#/tables")
    wait_text(browser, "#page", "orders__dead_letter", "clicks")

    js_errors, urls = page_logs(browser, console)
    assert not js_errors, f"the console logged errors: {js_errors}"
    assert_offline(urls)
    assert any(u.endswith("/tables/orders/consumingSegmentsInfo") for u in urls)


def test_pausing_needs_the_token_and_pauses_the_datastream(
    browser: WebDriver, console: str, cluster: Registry, shots: Path
) -> None:
    page_logs(browser, console)
    browser.get(console + "/ui/#/datastreams")
    wait_text(browser, "#datastream-list", "orders", "READY")

    click(browser, 'tr[data-datastream="orders"] [data-action=pause]')  # no token yet
    refused = wait_text(browser, "#alerts", "401")
    assert "pause orders failed: 401 UnauthorizedError: " in refused
    assert "POST /datastreams/orders/pause needs a bearer token" in refused
    assert "Enter the controller's API token" in refused
    assert cluster.get("orders").state is State.READY
    js_errors, _ = page_logs(browser, console)
    # The refused call is logged by the browser as a failed resource load; nothing else.
    assert all(e["source"] == "network" and " 401 " in e["message"] for e in js_errors), js_errors

    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.ID, "token-save").click()
    assert wait_text(browser, "#token-state", "token set")
    click(browser, 'tr[data-datastream="orders"] [data-action=pause]')

    assert "datastream orders is now PAUSED" in wait_text(browser, "#alerts", "PAUSED")
    assert cluster.get("orders").state is State.PAUSED
    wait_text(browser, 'tr[data-datastream="orders"] .ds-state', "PAUSED")
    resume = 'tr[data-datastream="orders"] [data-action=resume]'
    WebDriverWait(browser, WAIT).until(
        lambda d: d.find_element(By.CSS_SELECTOR, resume).is_enabled()
    )
    click(browser, resume)
    assert "datastream orders is now READY" in wait_text(browser, "#alerts", "READY")
    assert cluster.get("orders").state is State.READY
    js_errors, urls = page_logs(browser, console)
    assert not js_errors, js_errors
    assert_offline(urls)
    # The token is kept in this browser and sent on reads too.
    assert browser.execute_script("return localStorage.getItem('millstream.apiToken')") == TOKEN


SPEC_YAML = """# as in a spec file
name: payments
source: {{kind: files, path: {path}}}
table:
  primary_key: [id]
  mode: upsert
schema: {{id: long,
         status: string}}
max_records_per_batch: 1_000
segments:
  flush_rows: 500
"""


def test_creating_from_yaml_posts_the_spec_as_the_cli_does(
    browser: WebDriver, console: str, cluster: Registry, source_dir: Path
) -> None:
    browser.get(console + "/ui/#/datastreams")
    wait_text(browser, "#datastream-list", "orders")
    browser.execute_script("localStorage.setItem('millstream.apiToken', arguments[0])", TOKEN)
    spec = browser.find_element(By.ID, "spec")
    spec.clear()
    text = SPEC_YAML.format(path=source_dir / "payments")
    browser.execute_script("arguments[0].value = arguments[1]", spec, text)
    click(browser, "#create")

    created_text = wait_text(browser, "#alerts", "payments")
    assert "created datastream payments" in created_text
    # Its source directory does not exist yet: created all the same, with the API's warning.
    assert f"Warning: cannot read the latest offsets of files under {source_dir}" in created_text
    wait_text(browser, "#datastream-list", "payments", "INITIALIZING")
    created = cluster.get("payments")
    assert created.spec == DatastreamSpec.parse(yaml.safe_load(text))

    # An invalid spec shows the API's 422 naming the field.
    browser.execute_script("arguments[0].value = arguments[1]", spec, "name: bad\nschema: {}\n")
    click(browser, "#create")
    assert "422 InvalidSpecError: invalid " in wait_text(browser, "#alerts", "422")


YAML_DOCS = [
    SPEC_YAML.format(path="/data/in"),
    "name: orders\nsource: {kind: kafka, bootstrap_servers: 127.0.0.1:9092, topic: orders}\n"
    "table:\n  primary_key: [order_id]\n  mode: upsert\n"
    "schema: {order_id: long, customer: string, amount: double,\n"
    "         updated_at: timestamp, is_deleted: boolean}\n",
    "---\nlist:\n- a\n- 'it''s'\n-   b: 1\n    c: [1, 2.5, -3, 1e5, .5, ~, yes, Off]\n"
    "- - x\n  - y\nempty:\nurl: http://h:80/x  # comment\ns: a#b\n"
    'q: "tab\\there"\nnested:\n  deep: {a: [1, {b: c}], "k": \'v\'}\n',
    '{"name": "json", "replicas": 2}',
]


def test_the_consoles_yaml_reader_agrees_with_pyyaml(browser: WebDriver, console: str) -> None:
    """The console parses spec YAML in the browser; it must read what the CLI's
    yaml.safe_load reads, and refuse (naming the line) what it does not support."""
    browser.get(console + "/ui/")
    WebDriverWait(browser, WAIT).until(lambda d: d.execute_script("return !!window.MillstreamYaml"))
    parse = "return JSON.stringify(window.MillstreamYaml.parse(arguments[0]))"
    for doc in YAML_DOCS:
        assert json.loads(browser.execute_script(parse, doc)) == yaml.safe_load(doc), doc
    refuse = "try { window.MillstreamYaml.parse(arguments[0]); return null } catch (e) { return e.message }"
    assert browser.execute_script(refuse, "a: |\n  text\n") == (
        "line 1: block scalars (| and >) are not supported here; use the CLI"
    )
    assert browser.execute_script(refuse, "a: b\n  c: d\n") == "line 2: unexpected indentation"


def test_the_console_is_served_from_the_package_and_root_redirects(console: str) -> None:
    with httpx.Client(base_url=console) as client:
        root = client.get("/")
        assert (root.status_code, root.headers["location"]) == (307, "/ui/")
        assert client.get("/ui").headers["location"] == "/ui/"
        page = client.get("/ui/")
        assert page.status_code == 200 and "Millstream console" in page.text
        for asset in ("console.js", "yaml.js", "console.css"):
            assert client.get(f"/ui/{asset}").status_code == 200
        assert "/ui/" not in client.get("/openapi.json").json()["paths"]


def test_a_failing_datastream_shows_its_writer_failing_on_the_main_page(
    browser: WebDriver,
    catalog: Catalog,
    controller: Controller,
    clock: ManualClock,
    tmp_path: Path,
    kafka_broker: Any,
    shots: Path,
) -> None:
    """READY with an empty last error, and its writer failing every few seconds (a topic that
    does not exist): the main page says so, with the error and since when."""
    Registry(catalog.store, clock=clock).create(
        DatastreamSpec.parse(
            {
                "name": "broken",
                "source": {
                    "kind": "kafka",
                    "bootstrap_servers": kafka_broker.bootstrap,
                    "topic": "no-such",
                },
                "schema": {"id": "long", "status": "string"},
                "table": {"mode": "upsert", "primary_key": ["id"]},
            }
        )
    )
    worker = run_failing_writer(catalog, controller, clock, tmp_path / "state", "worker-b")
    try:
        with serve(create_app(catalog, controller=controller, clock=clock)) as url:
            browser.get("about:blank")  # an earlier test's page polls its stopped server
            page_logs(browser, url)
            browser.get(url + "/ui/#/datastreams")
            row = 'tr[data-datastream="broken"]'
            wait_text(browser, f"{row} .ds-state", "READY")
            health = wait_text(browser, f"{row} .ds-health", "retrying for", "next try in")
            assert "kafka topic 'no-such'" in health and "the topic was not found" in health
            assert "error-text" in (
                browser.find_element(By.CSS_SELECTOR, f"{row} .ds-health").get_attribute("class")
                or ""
            )
            browser.save_screenshot(str(shots / "console-failing-datastream.png"))
            # The table's page says it too, beside the state.
            browser.get(url + "/ui/#/tables/broken")
            assert "the topic was not found" in wait_text(browser, "#writer-health", "retrying")
            js_errors, urls = page_logs(browser, url)
            assert not js_errors, js_errors
            assert_offline(urls)
            browser.get("about:blank")  # no poll of this server after it stops
    finally:
        worker._stop_shared()
        CONSUMERS.close()  # its clients of the test broker, before the broker stops


def test_the_table_page_figures_agree_with_the_metrics(
    browser: WebDriver,
    catalog: Catalog,
    controller: Controller,
    clock: ManualClock,
    source_dir: Path,
) -> None:
    """A 5-row upsert table holding 8 row versions (3 keys updated, not sealed yet): the
    page's rows are millstream_table_rows' 5, the stored versions are shown as such, and no
    chart label reads a negative zero."""
    lines = [{"id": i % 5, "status": f"v{i}"} for i in range(8)]
    d = source_dir / "0"
    d.mkdir(parents=True)
    (d / "00000.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    spec = DatastreamSpec.parse(spec_body("five", source_dir))
    Registry(catalog.store, clock=clock).create(spec)
    controller.tick()
    ingest_range(catalog, spec, 0, 0, 8)
    with serve(create_app(catalog, controller=controller, clock=clock)) as url:
        metric = next(
            line
            for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines()
            if line.startswith('millstream_table_rows{table="five"}')
        )
        assert metric.split()[-1] == "5.0"
        browser.get("about:blank")  # an earlier test's page polls its stopped server
        page_logs(browser, url)
        browser.get(url + "/ui/#/tables/five")
        assert wait_text(browser, "#rows", "5") == "5"
        assert wait_text(browser, "#row-versions", "8") == "8"
        WebDriverWait(browser, WAIT).until(lambda _: samples(browser) >= 2)
        labels = [
            e.text for e in browser.find_elements(By.CSS_SELECTOR, "svg.chart text") if e.text
        ]
        assert labels and not [t for t in labels if t.startswith("-0")], labels
        # The axis's own formatting of a rate a hair below zero (float noise) reads 0.
        assert browser.execute_script("return short(-0.0001) + '/s'") == "0/s"
        js_errors, _ = page_logs(browser, url)
        assert not js_errors, js_errors
        browser.get("about:blank")  # no poll of this server after it stops


def test_a_stalled_writer_shows_on_the_main_page_and_the_errors_page(
    browser: WebDriver,
    catalog: Catalog,
    controller: Controller,
    clock: ManualClock,
    source_dir: Path,
) -> None:
    """What a worker's watchdog reports for a stalled writer (its heartbeat's ``health``)."""
    write_lines(source_dir, 0, 15)
    Registry(catalog.store, clock=clock).create(
        DatastreamSpec.parse(spec_body("orders", source_dir))
    )
    beat(catalog, clock, "worker-a", "orders")
    controller.tick()
    since = clock.now() - 400
    stall = (
        "stalled: datastream 'orders' has not advanced for 400 s while its source holds "
        "newer records: partition 0 at offset 10 (source latest 15)"
    )
    health = {
        "status": "stalled",
        "error": stall,
        "since": since,
        "failures": 1,
        "retry_at": clock.now() + 5,
        "stalled": {"since": since, "partitions": {"0": {"upper": 10, "latest": 15}}},
        "stall_restarts": 1,
    }
    heartbeat(
        catalog.store,
        "worker-a",
        status="RUNNING",
        info={
            "writers": [
                {
                    "datastream": "orders",
                    "role": "active",
                    "running": False,
                    "error": stall,
                    "health": health,
                }
            ]
        },
        clock=clock,
    )
    with serve(create_app(catalog, controller=controller, clock=clock)) as url:
        browser.get("about:blank")  # an earlier test's page polls its stopped server
        page_logs(browser, url)
        browser.get(url + "/ui/#/datastreams")
        cell = wait_text(browser, 'tr[data-datastream="orders"] .ds-health', "stalled for")
        assert "partition 0 at offset 10 (source latest 15)" in cell
        browser.get(url + "/ui/#/errors")
        errors = wait_text(browser, "#page", "writer of orders on worker worker-a (stalled)")
        assert "The watchdog restarts the writer with backoff (restarts so far: 1)" in errors
        assert "pause and resume orders" in errors
        js_errors, _ = page_logs(browser, url)
        assert not js_errors, js_errors
        browser.get("about:blank")  # no poll of this server after it stops
