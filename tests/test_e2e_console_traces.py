"""End to end: the console's trace views in a real headless Chromium (issue #20, items 1 and 4).

A stack of this module's own (`enmasse up`: the console reads `<var>/analytics`, where
`enmasse-analytics` writes), two address spaces with an address each, and a tenant-admin token
of one of them. Before any table exists, /traces says which command makes them. Then the real
analytics job (on the pytest session's Spark session) turns a few generated message traces of
both spaces into its Parquet tables under `<var>/analytics`, as `enmasse-analytics` would from
`<var>/traces`: `orders` of the tenant's space (3 messages, end-to-end 10, 20, 30 ms: p50 20 ms)
and `events` of the other space. Chromium logs in with the tenant's token and:

- opens Traces from the nav: its address's row with p50 / p95 / p99 and the hops, and no row,
  nor name, of the other tenant's space or address;
- follows the row to the address's own trace page: the hops in path order with their figures;
- is refused the other space's address's trace page with the API's own message.

`enmasse dashboard --no-browser` prints the console's trace view, which answers 200 with the
tenant's row to the logged-in user's cookie and sends a request without one to the login page.
Screenshots: bench/out/console-traces*.png (git-ignored).
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from enmasse.analytics import job, synthetic
from enmasse.common import tracing
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.fixtures.local_runtime import LocalRuntime, enmasse, running, wait_until
from tests.test_e2e_console import TOKEN_COOKIE, screenshot, script, until
from tests.test_e2e_console import browser as browser

pytestmark = pytest.mark.slow

TENANT_SPACE, OTHER_SPACE = "traces-shop", "traces-other"
TENANT_ADDRESS, OTHER_ADDRESS = "orders", "events"
MS = 1_000_000
S = 1_000_000_000
T0 = 1_700_000_000 * S
GAP = MS // 10
E2E_MS = (10, 20, 30)

MANIFESTS = f"""
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {{name: {TENANT_SPACE}}}
spec: {{type: standard, plan: standard-small}}
---
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {{name: {OTHER_SPACE}}}
spec: {{type: standard, plan: standard-small}}
---
apiVersion: enmasse.io/v1
kind: Address
metadata: {{name: {TENANT_ADDRESS}, space: {TENANT_SPACE}}}
spec: {{address: {TENANT_ADDRESS}, type: queue, plan: standard-small-queue}}
---
apiVersion: enmasse.io/v1
kind: Address
metadata: {{name: {OTHER_ADDRESS}, space: {OTHER_SPACE}}}
spec: {{address: {OTHER_ADDRESS}, type: anycast, plan: standard-anycast}}
"""

ROW = "tr[data-space='{space}'][data-address='{address}']"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRuntime]:
    with running(tmp_path_factory.mktemp("console-traces") / "var") as runtime:
        runtime.apply(MANIFESTS)
        yield runtime


@pytest.fixture(scope="module")
def tenant_token(stack: LocalRuntime) -> str:
    made = enmasse(
        stack.var, "token", "create", "shop-traces", "--role", "tenant-admin", "-s", TENANT_SPACE
    )
    assert made.returncode == 0, made.stderr
    return made.stdout.strip().splitlines()[0]


@pytest.fixture(scope="module")
def console_url(stack: LocalRuntime) -> str:
    url_file = stack.var / "run" / "console.url"
    assert wait_until(url_file.exists, timeout=30), "enmasse-console wrote no URL"
    return url_file.read_text().strip()


@pytest.fixture(scope="module")
def signed_in(console_url: str, tenant_token: str, browser: WebDriver) -> WebDriver:
    browser.get(console_url + "/login")
    browser.find_element(By.ID, "token").send_keys(tenant_token)
    browser.find_element(By.CSS_SELECTOR, "#login-form button").click()
    until(
        lambda: browser.current_url == console_url + "/",
        timeout=30,
        what=f"not logged in: {script(browser, 'return document.body.innerText')!r}",
    )
    return browser


def _spans() -> list[synthetic.SpanRecord]:
    ids = synthetic.Ids()
    records: list[synthetic.SpanRecord] = []
    for second, e2e_ms in enumerate(E2E_MS, start=1):
        # A consumer that does not trace: the router's `router.deliver` ends the trace. Six
        # hops of 7 ms plus the residence, a gap after each: end-to-end is exactly e2e_ms.
        records += synthetic.message_trace(
            ids,
            start_ns=T0 + second * S,
            space=TENANT_SPACE,
            address=TENANT_ADDRESS,
            address_type="queue",
            client_id="shop-app",
            hops=[
                (tracing.SPAN_WAYPOINT, 1 * MS),
                (tracing.SPAN_ENQUEUE, 2 * MS),
                (tracing.SPAN_QUEUE_RESIDENCE, e2e_ms * MS - 7 * MS - 6 * GAP),
                (tracing.SPAN_DEQUEUE, 1 * MS),
                (tracing.SPAN_ROUTE, 1 * MS),
                (tracing.SPAN_ROUTER_DELIVER, 2 * MS),
            ],
            gap_ns=GAP,
        )
    records += synthetic.message_trace(
        ids,
        start_ns=T0 + 5 * S,
        space=OTHER_SPACE,
        address=OTHER_ADDRESS,
        address_type="anycast",
        client_id="other-app",
        hops=[(tracing.SPAN_ROUTE, 1 * MS), (tracing.SPAN_ROUTER_DELIVER, 1 * MS)],
        gap_ns=GAP,
    )
    return records


@pytest.fixture(scope="module")
def tables(stack: LocalRuntime, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The analytics job's tables in <var>/analytics, where the console reads them."""
    spans = tmp_path_factory.mktemp("console-traces-spans")
    synthetic.write_spans(spans, _spans())
    result = job.run(spark, inputs=[spans], output=stack.var / "analytics")
    assert result.messages == 4
    return result.output


def _page_text(browser: WebDriver) -> str:
    return str(script(browser, "return document.body.innerText") or "")


def _cell(browser: WebDriver, row: str, cell: str) -> str | None:
    found: str | None = script(
        browser, f'const c = document.querySelector("{row} .{cell}"); return c && c.innerText;'
    )
    return found


def test_without_tables_the_page_names_the_command_that_makes_them(
    signed_in: WebDriver, console_url: str, stack: LocalRuntime
) -> None:
    signed_in.get(console_url + "/traces")
    notice = signed_in.find_element(By.ID, "traces-notice").text
    assert notice == (
        f"No trace tables yet in {stack.var / 'analytics'}: run `enmasse-analytics` (once) or "
        "`enmasse-analytics --live` (kept within seconds of the traffic)."
    )


def test_a_tenant_sees_its_addresses_latency_and_not_another_tenants(
    signed_in: WebDriver, console_url: str, tables: Path
) -> None:
    signed_in.get(console_url + "/")
    signed_in.find_element(By.ID, "nav-traces").click()
    until(
        lambda: signed_in.current_url == console_url + "/traces",
        timeout=30,
        what="the nav's Traces link did not lead to /traces",
    )
    row = ROW.format(space=TENANT_SPACE, address=TENANT_ADDRESS)
    until(
        lambda: _cell(signed_in, row, "p50") == "20.00 ms",
        timeout=30,
        what=f"no latency row for {TENANT_ADDRESS}: {_page_text(signed_in)!r}",
    )
    assert _cell(signed_in, row, "p95") == "29.00 ms"
    assert _cell(signed_in, row, "p99") == "29.80 ms"
    assert _cell(signed_in, row, "messages") == "3"
    assert _cell(signed_in, row, "sent") == "3"
    hops = _cell(signed_in, row, "hops") or ""
    assert "broker.queue_residence" in hops
    assert "router.deliver 2.00 ms" in hops
    assert signed_in.find_element(By.ID, "traces-refreshed").text.startswith("Tables from ")
    assert script(signed_in, "return document.querySelectorAll('#traces-notice').length") == 0
    other = ROW.format(space=OTHER_SPACE, address=OTHER_ADDRESS)
    assert script(signed_in, f'return document.querySelectorAll("{other}").length') == 0
    text = _page_text(signed_in)
    assert OTHER_SPACE not in text
    assert OTHER_ADDRESS not in text
    screenshot(signed_in, "traces")


def test_the_address_page_shows_its_hops_in_path_order(
    signed_in: WebDriver, console_url: str, tables: Path
) -> None:
    signed_in.get(console_url + "/traces")
    row = ROW.format(space=TENANT_SPACE, address=TENANT_ADDRESS)
    signed_in.find_element(By.CSS_SELECTOR, f"{row} .address a").click()
    page = f"{console_url}/spaces/{TENANT_SPACE}/addresses/{TENANT_ADDRESS}/traces"
    until(lambda: signed_in.current_url == page, timeout=30, what="no address trace page")
    hops = script(
        signed_in,
        "return [...document.querySelectorAll('#hops tr[data-hop]')].map(r => r.dataset.hop);",
    )
    assert hops == [
        tracing.SPAN_WAYPOINT,
        tracing.SPAN_ENQUEUE,
        tracing.SPAN_QUEUE_RESIDENCE,
        tracing.SPAN_DEQUEUE,
        tracing.SPAN_ROUTE,
        tracing.SPAN_ROUTER_DELIVER,
    ]
    assert _cell(signed_in, "#latency", "p50") == "20.00 ms"
    assert "Sent 3 (" in signed_in.find_element(By.ID, "throughput").text
    screenshot(signed_in, "traces-address")


def test_another_spaces_address_trace_page_is_refused_by_the_api(
    signed_in: WebDriver, console_url: str, tables: Path
) -> None:
    signed_in.get(f"{console_url}/spaces/{OTHER_SPACE}/addresses/{OTHER_ADDRESS}/traces")
    refusal = signed_in.find_element(By.ID, "api-error").text
    assert OTHER_SPACE in refusal
    assert "20.00 ms" not in _page_text(signed_in)


def test_enmasse_dashboard_prints_the_trace_view_a_logged_in_user_gets(
    stack: LocalRuntime, console_url: str, tenant_token: str, tables: Path
) -> None:
    shown = enmasse(stack.var, "dashboard", "--no-browser")
    assert shown.returncode == 0, shown.stderr
    url = shown.stdout.strip()
    assert url == console_url + "/traces"
    request = urllib.request.Request(url, headers={"Cookie": f"{TOKEN_COOKIE}={tenant_token}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200
        assert answer.url == url  # not sent to the login page
        page = answer.read().decode()
    assert f'data-address="{TENANT_ADDRESS}"' in page
    assert OTHER_SPACE not in page
    with urllib.request.urlopen(url, timeout=30) as anonymous:  # follows the redirect
        assert anonymous.url == console_url + "/login"
