"""The batch job submitted unchanged to a Spark standalone cluster: a real master and a real
worker, started with `spark-class` from the pyspark package, on loopback, for this test only.

`enmasse-analytics --master spark://...` runs on the known traffic of conftest.py, and its tables
are the ones the local job wrote (the `job_output` fixture): the executors the worker launched
did the work, the driver only planned it. Master and worker are stopped at the end, by PID.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest
from enmasse.analytics import job
from enmasse.analytics.job import rows

pytestmark = pytest.mark.slow

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
LOOPBACK = {"SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _start(args: list[str], *, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(SPARK_CLASS), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **LOOPBACK},
            start_new_session=True,
        )


def _wait_log(process: subprocess.Popen[bytes], log: Path, line: str, *, limit: float) -> None:
    deadline = time.monotonic() + limit
    while line not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no {line!r} in {log}:\n{log.read_text(errors='replace')}")
        time.sleep(0.2)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A master and one worker (2 cores, room for one executor of Spark's default 1 GB)."""
    logs = tmp_path_factory.mktemp("standalone")
    url = f"spark://127.0.0.1:{_free_port()}"
    master_port = url.rsplit(":", 1)[1]
    master = _start(
        [
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", master_port, "--webui-port", "0"),
        ],
        log=logs / "master.log",
    )
    worker = None
    try:
        _wait_log(master, logs / "master.log", "I have been elected leader", limit=120)
        worker = _start(
            [
                "org.apache.spark.deploy.worker.Worker",
                *("--host", "127.0.0.1", "--cores", "2", "--memory", "1536m"),
                *("--webui-port", "0", "--work-dir", str(logs / "work"), url),
            ],
            log=logs / "worker.log",
        )
        _wait_log(worker, logs / "worker.log", "Successfully registered with master", limit=120)
        yield url
    finally:
        if worker is not None:
            _stop(worker)
        _stop(master)


def _comparable(table: list[dict[str, Any]]) -> list[str]:
    """Rows as text, floats to 9 digits (a mean may sum in another order on other executors),
    sorted (rows that tie in a table's order may come either way)."""
    return sorted(
        repr({k: round(v, 9) if isinstance(v, float) else v for k, v in row.items()})
        for row in table
    )


def test_the_job_runs_unchanged_on_a_standalone_cluster(
    spark: Any,
    standalone: str,
    scenario_dir: Path,
    job_output: job.JobResult,
    tmp_path: Path,
) -> None:
    command = Path(sys.executable).with_name("enmasse-analytics")
    output = tmp_path / "cluster"
    done = subprocess.run(
        [str(command), "-i", str(scenario_dir), "-o", str(output), "--master", standalone],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **LOOPBACK},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        f"{job_output.spans} spans, {job_output.messages} messages -> {len(job.TABLES)} tables"
    )
    for name in ("latency_address", "hop_latency", "errors", "top_talkers", "address_readiness"):
        on_cluster = _comparable(rows(spark.read.parquet(str(output / name))))
        local = _comparable(rows(spark.read.parquet(str(job_output.tables[name]))))
        assert on_cluster == local, name
    assert (output / job.DASHBOARD).stat().st_size > 0
