"""`enmasse-analytics`: wiring of the job to the command line.

    enmasse-analytics [-i PATH ...] [-o DIR] [--master URL] [--window S] [--top N]

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
def main(
    inputs: tuple[str, ...],
    output: str | None,
    master: str,
    window: int,
    top: int,
    driver_memory: str,
) -> None:
    """Turn OTLP-JSON traces into Parquet tables and a static HTML dashboard."""
    configure_logging(service="analytics", renderer="console", level="WARNING")
    # Imported late: `--help` should not wait for Spark's modules.
    from enmasse.analytics import job
    from enmasse.analytics.session import spark_session
    from enmasse.analytics.spans import expand_paths

    paths = list(inputs) or [str(_var() / "traces")]
    if not expand_paths(paths):
        raise click.ClickException(f"no span files (*.jsonl, *.json) in {', '.join(paths)}")
    target = Path(output) if output else _var() / "analytics"
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


if __name__ == "__main__":
    main()
