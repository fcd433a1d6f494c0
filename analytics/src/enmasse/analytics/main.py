"""`enmasse-analytics`: wiring of the job to the command line.

    enmasse-analytics [-i PATH ...] [-o DIR] [--master URL] [--window S] [--top N]
    enmasse-analytics --live [-i DIR] [-o DIR] [--trigger S] [--horizon S]   (until Ctrl-C)

Inputs default to $ENMASSE_VAR/traces (else ./var/traces), where every process writes its spans;
output to <var>/analytics. Failures the user can cause (no span files, a bad window) end as
`error: <message>` and exit code 1.
"""

from __future__ import annotations

import os
from pathlib import Path

import click
from enmasse.common.logging import configure_logging


def _var() -> Path:
    return Path(os.environ.get("ENMASSE_VAR", "var"))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-i", "--input", "inputs", multiple=True, metavar="PATH", help="span files or folders"
)
@click.option("-o", "--output", metavar="DIR", help="tables + dashboard.html [<var>/analytics]")
@click.option("--master", default="local[2]", show_default=True, help="Spark master URL")
@click.option("--window", type=click.IntRange(min=1), default=10, show_default=True, help="seconds")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--driver-memory", default="1g", show_default=True)
@click.option("--live", is_flag=True, help="keep per-address tables live (Structured Streaming)")
@click.option(
    "--trigger", type=click.FloatRange(min=0.1), default=2.0, show_default=True, help="seconds"
)
@click.option(
    "--horizon",
    type=click.IntRange(min=1),
    help="--live: tables cover the last S seconds of spans only [all]",
    metavar="S",
)
def main(
    inputs: tuple[str, ...],
    output: str | None,
    master: str,
    window: int,
    top: int,
    driver_memory: str,
    live: bool,
    trigger: float,
    horizon: int | None,
) -> None:
    """Turn OTLP-JSON traces into Parquet tables and a static HTML dashboard."""
    configure_logging(service="analytics", renderer="console", level="WARNING")
    # Imported late: `--help` should not wait for Spark's modules.
    from enmasse.analytics import job
    from enmasse.analytics.session import spark_session
    from enmasse.analytics.spans import expand_paths

    paths = list(inputs) or [str(_var() / "traces")]
    target = Path(output) if output else _var() / "analytics"
    if live:
        _live(
            folder=paths,
            output=target,
            master=master,
            driver_memory=driver_memory,
            window=window,
            trigger=trigger,
            horizon=horizon,
        )
        return
    if not expand_paths(paths):
        raise click.ClickException(f"no span files (*.jsonl, *.json) in {', '.join(paths)}")
    spark = spark_session(master=master, driver_memory=driver_memory)
    try:
        result = job.run(spark, inputs=paths, output=target, window_seconds=window, top=top)
    finally:
        spark.stop()
    click.echo(
        f"{result.spans} spans, {result.messages} messages -> {len(result.tables)} tables in "
        f"{result.output}; dashboard: {result.dashboard}"
    )
    if result.malformed_lines:
        click.echo(f"warning: skipped {result.malformed_lines} malformed lines", err=True)


def _live(
    *,
    folder: list[str],
    output: Path,
    master: str,
    driver_memory: str,
    window: int,
    trigger: float,
    horizon: int | None,
) -> None:
    """Keeps the per-address tables under `output` live until Ctrl-C."""
    from enmasse.analytics import live
    from enmasse.analytics.session import spark_session

    if len(folder) != 1 or not Path(folder[0]).is_dir():
        raise click.ClickException(f"--live watches one folder, not {', '.join(folder)}")
    spark = spark_session(master=master, driver_memory=driver_memory)
    query = live.start(
        spark,
        traces=folder[0],
        output=output,
        window_seconds=window,
        trigger_seconds=trigger,
        horizon_seconds=horizon,
    )
    click.echo(f"live tables in {output} (refreshed every {trigger} s); Ctrl-C to stop")
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
