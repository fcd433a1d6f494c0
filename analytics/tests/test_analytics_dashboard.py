"""The whole job on the known traffic, then its dashboard as a person sees it.

The job writes every table as Parquet (read back here with Spark) and `dashboard.html`; headless
Chromium (Debian `chromium`) loads the page from the file system with no network, must log no
console message at all (no error, no warning), and must have drawn every chart the page holds
(plotly marks a drawn chart `js-plotly-plot`). The screenshot is kept as a test artifact at
bench/out/analytics/dashboard.png (and in the test's tmp dir). `enmasse dashboard --serve` serves
the same page on a loopback port, and without a dashboard says how to make one.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from enmasse.analytics import dashboard, job

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[2] / "bench" / "out" / "analytics"
_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--enable-logging=stderr",
    "--log-level=0",
)


def _chromium(*args: str, profile: Path, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """Runs headless Chromium in its own process group and kills that group if it hangs."""
    assert CHROMIUM, "chromium is not installed (scripts/setup installs it)"
    command = [CHROMIUM, *_FLAGS, f"--user-data-dir={profile}", *args]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def test_job_writes_every_table_and_the_dashboard(spark: Any, job_output: job.JobResult) -> None:
    assert set(job_output.tables) == set(job.TABLES)
    counts = {
        name: spark.read.parquet(str(path)).count() for name, path in job_output.tables.items()
    }
    assert counts["spans"] == 64
    assert counts["messages"] == 10
    assert counts["latency_address"] == 2
    assert counts["top_talkers"] == 3
    assert job_output.malformed_lines == 0
    # 5 overview charts + 4 per address space, every one with data in this traffic.
    assert job_output.charts == 5 + 4 * 2
    page = job_output.dashboard.read_text()
    assert "Address space tenant-a" in page
    assert "Address space tenant-b" in page
    assert "64 spans, 10 messages, window 10 s" in page
    # Readable without a server or the internet: no script or stylesheet is fetched.
    assert not re.search(r"<script[^>]+src=", page)
    assert not re.search(r"<link[^>]+href=", page)


def test_dashboard_renders_in_headless_chromium(job_output: job.JobResult, tmp_path: Path) -> None:
    url = job_output.dashboard.as_uri()
    dom = _chromium("--virtual-time-budget=15000", "--dump-dom", url, profile=tmp_path / "p1")
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []
    drawn = re.findall(r'<div id="chart-\d+" class="[^"]*js-plotly-plot', dom.stdout)
    assert len(drawn) == job_output.charts
    assert dom.stdout.count('class="main-svg"') >= job_output.charts

    shot = tmp_path / "dashboard.png"
    taken = _chromium(
        "--virtual-time-budget=15000",
        "--hide-scrollbars",
        "--window-size=1400,3000",
        f"--screenshot={shot}",
        url,
        profile=tmp_path / "p2",
    )
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert [line for line in taken.stderr.splitlines() if ":CONSOLE" in line] == []
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 50_000  # charts, not a blank page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, ARTIFACTS / "dashboard.png")


def test_enmasse_dashboard_serves_the_page_on_loopback(job_output: job.JobResult) -> None:
    enmasse = Path(sys.executable).with_name("enmasse")
    proc = subprocess.Popen(
        [str(enmasse), "dashboard", "--serve", "--path", str(job_output.dashboard)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/dashboard\.html", url), url
        with urllib.request.urlopen(url, timeout=10) as response:
            body = response.read().decode()
        assert response.status == 200
        assert body == job_output.dashboard.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""


def test_enmasse_dashboard_without_a_dashboard_says_how_to_make_one(tmp_path: Path) -> None:
    enmasse = Path(sys.executable).with_name("enmasse")
    done = subprocess.run(
        [
            str(enmasse),
            "--var-dir",
            str(tmp_path),
            "dashboard",
            "--path",
            str(tmp_path / "analytics" / "dashboard.html"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    expected = (
        f"error: no dashboard at {tmp_path.resolve()}/analytics/dashboard.html: "
        "run `enmasse-analytics` first"
    )
    assert done.stderr.startswith(expected), done.stderr


def test_enmasse_analytics_without_span_files_says_so(tmp_path: Path) -> None:
    command = Path(sys.executable).with_name("enmasse-analytics")
    done = subprocess.run(
        [str(command), "-i", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert f"Error: no span files (*.jsonl, *.json) in {tmp_path / 'none'}" in done.stderr


def test_empty_tables_render_sentences_not_empty_charts() -> None:
    page = dashboard.render(dashboard.DashboardData(summary="0 spans"))
    assert page.charts == 0
    assert '<div class="chart">' not in page.html
    assert "<b>Messages sent per second, per address space</b>: no sampled sends" in page.html
    assert "<b>Errors and rejections by condition</b>: no errors or rejections" in page.html
    assert "Address space" not in page.html  # no space, no per-space section
