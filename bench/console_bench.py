"""Console benchmark: how long a space page with 5,000 addresses takes to load. Figures, not
assertions.

Starts its own etcd, `enmasse-config` (no --auth: any token logs in) and `enmasse-console` (real
processes, as deployed, without a var dir: no live figures, which need routers) on free loopback
ports in a temp dir, writes one address space with N anycast addresses (Apply, 500 a call), and
measures:

- the server's answer: GET /spaces/<space> with the login cookie (the console lists the space's
  addresses and users through the API and renders the table), seconds per page and its size,
  the median of a few;
- in a real headless Chromium (Debian's `chromium` and `chromium-driver`, as the browser tests):
  from navigation start to the `load` event (the page as served, painted), and to "live" (the
  page's EventSource has had the Watch's ADDED event of every address and SYNCED, and the
  script has applied each one to the table), the median of a few.

Run: `.venv/bin/python -m bench console [--quick]` (5,000 addresses; --quick: 500), or
`.venv/bin/python -m bench.console_bench [--addresses N] [--runs N]`. The machine's cores are
shared with whatever else runs: read the figures as orders of magnitude.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
from enmasse.resources.kinds import resource_of
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from bench.harness import Context, Table, suite
from tests.fixtures.config_service import ConfigProcess
from tests.fixtures.etcd import EtcdProcess

SPACE = "crowded"
BENCH_PLAN = "bench-console"
TOKEN_COOKIE = "enmasse_console_token"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
BATCH = 500
START_SECONDS = 60.0
LOADED = (
    "const t = performance.getEntriesByType('navigation')[0];"
    " return t && t.loadEventEnd > 0 ? t.loadEventEnd : null;"
)
LIVE = "return window.benchLiveAt === undefined ? null : window.benchLiveAt;"
WATCH_LIVE = """
new MutationObserver((_changes, observer) => {
  const live = document.getElementById('live');
  if (live && live.classList.contains('on')) {
    window.benchLiveAt = performance.now();
    observer.disconnect();
  }
}).observe(document, {attributes: true, subtree: true, attributeFilter: ['class']});
"""
"""Installed before each page's own script: the moment #live turns on, read off the page's
clock (the same origin as the navigation timing's), not when a poll happens to see it."""


async def fill(target: str, *, addresses: int) -> None:
    """A space plan without quotas, the space, and `addresses` anycast addresses in it."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        await stub.CreateAddressSpacePlan(
            resources_pb2.AddressSpacePlan(
                metadata={"name": BENCH_PLAN},
                spec={"address_space_type": "standard", "address_plans": ["standard-anycast"]},
            )
        )
        await stub.CreateAddressSpace(
            resources_pb2.AddressSpace(
                metadata={"name": SPACE}, spec={"type": "standard", "plan": BENCH_PLAN}
            )
        )
        for start in range(0, addresses, BATCH):
            batch = [
                resource_of(
                    resources_pb2.Address(
                        metadata={"name": f"a{n:05d}", "space": SPACE},
                        spec={
                            "address": f"a{n:05d}",
                            "type": "anycast",
                            "plan": "standard-anycast",
                        },
                    )
                )
                for n in range(start, min(addresses, start + BATCH))
            ]
            await stub.Apply(config_pb2.ApplyRequest(space=SPACE, manager="bench", resources=batch))


def start_console(*, config: str, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    url_file = workdir / "console.url"
    console = Path(sys.executable).with_name("enmasse-console")
    process = subprocess.Popen(
        [str(console), "--config", config, "--url-file", str(url_file)],
        stdout=subprocess.DEVNULL,
        stderr=(workdir / "console.log").open("wb"),
    )
    deadline = time.monotonic() + START_SECONDS
    while not url_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"enmasse-console did not start: see {workdir / 'console.log'}")
        time.sleep(0.1)
    return process, url_file.read_text().strip()


def server_page(url: str, *, runs: int) -> tuple[float, int]:
    """(median seconds, bytes) of GET <url>/spaces/<space> with the login cookie."""
    request = urllib.request.Request(
        f"{url}/spaces/{SPACE}", headers={"Cookie": f"{TOKEN_COOKIE}=bench"}
    )
    times, size = [], 0
    for _ in range(runs):
        began = time.perf_counter()
        with urllib.request.urlopen(request, timeout=120) as response:
            size = len(response.read())
        times.append(time.perf_counter() - began)
    return statistics.median(times), size


def browser_page(url: str, *, runs: int) -> tuple[float, float]:
    """(median seconds to the load event, median seconds to live) in headless Chromium."""
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(120)
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": WATCH_LIVE})
    loads, lives = [], []
    try:
        driver.get(url + "/login")
        driver.add_cookie({"name": TOKEN_COOKIE, "value": "bench", "path": "/"})
        for _ in range(runs):
            driver.get(f"{url}/spaces/{SPACE}")  # returns once the page has loaded
            loads.append(_poll(driver, LOADED) / 1000)
            lives.append(_poll(driver, LIVE) / 1000)
    finally:
        driver.quit()
    return statistics.median(loads), statistics.median(lives)


def _poll(driver: webdriver.Chrome, script: str, *, timeout: float = 120.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = driver.execute_script(script)
        if value is not None:
            return float(value)
        time.sleep(0.05)
    raise TimeoutError(f"not seen in {timeout} s: {script}")


def measure(*, addresses: int, runs: int, workdir: Path) -> list[tuple[str, str]]:
    etcd = EtcdProcess(data_dir=workdir / "etcd-data")
    etcd.start()
    (workdir / "config").mkdir()
    config = ConfigProcess(etcd_endpoint=etcd.endpoint, prefix="/bench", workdir=workdir / "config")
    console: subprocess.Popen[bytes] | None = None
    try:
        config.start()
        asyncio.run(fill(config.target, addresses=addresses))
        console, url = start_console(config=config.target, workdir=workdir)
        served, size = server_page(url, runs=runs)
        loaded, live = browser_page(url, runs=runs)
    finally:
        if console is not None:
            console.terminate()
            console.wait(timeout=30)
        config.stop()
        etcd.stop()
    return [
        (f"GET /spaces/<space>, {addresses:,} addresses (server render)", f"{served:.3f} s"),
        ("page size", f"{size / 1024:,.0f} KiB"),
        ("Chromium: navigation start -> load event", f"{loaded:.3f} s"),
        ("Chromium: navigation start -> live (every ADDED applied, SYNCED)", f"{live:.3f} s"),
    ]


@suite("console", "web console: a space page with 5,000 addresses, served and in Chromium")
def console_suite(ctx: Context) -> Iterator[Table]:
    addresses = 500 if ctx.quick else 5_000
    runs = 3 if ctx.quick else 5
    with tempfile.TemporaryDirectory(prefix="console-bench-") as tmp:
        rows = measure(addresses=addresses, runs=runs, workdir=Path(tmp))
    table = Table(title=f"Console page load ({runs} runs, medians)", columns=["measure", "value"])
    for name, value in rows:
        table.add(name, value)
    table.notes.append(f"load average at the end: {os.getloadavg()[0]:.2f}")
    yield table


def main() -> None:
    parser = argparse.ArgumentParser(description="console page-load benchmark")
    parser.add_argument("--addresses", type=int, default=5_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="console-bench-") as tmp:
        rows = measure(addresses=args.addresses, runs=args.runs, workdir=Path(tmp))
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")


if __name__ == "__main__":
    main()
