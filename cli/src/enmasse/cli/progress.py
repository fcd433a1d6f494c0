"""What long verbs (`up`, `down`, `apply` of many manifests, `gitops sync`) say while they work.

In: the steps a verb goes through (`step("waiting for the config service")`), and, for counted
work, how far it is (`advance`). Out, on stderr, so that stdout keeps only the verb's result
(what scripts parse):
- on a terminal, a live `rich` display: a spinner with the current step and the seconds it has
  taken, a bar for counted work, and each finished step left behind as `✓ step (1.2 s)`;
- not on a terminal (a pipe, a CI log) or with `--quiet`, one plain line per step,
  `up: waiting for ...`; for `apply` and `gitops sync` nothing more than their own result lines
  (`address/orders created`), which already say each step.

`open_progress` picks one; the verbs only call `step`, `advance` and `close` (or use it as a
context manager), so the same code runs under all three.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import TextIO

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

DONE_MARK = "✓"
FAILED_MARK = "✗"


class Reporter:
    """Says nothing (--quiet); the base of the two that speak."""

    def step(self, text: str, *, total: int | None = None) -> None:
        """A new step begins (the one before it is done); `total`: it counts to that."""

    def advance(self, amount: int = 1) -> None:
        """Counted work moved on."""

    def echo(self, line: str, *, err: bool = False) -> None:
        """A result line of the verb, for stdout (stderr: `err`), above the live display when
        there is one."""
        click.echo(line, err=err)

    def close(self) -> None:
        """The last step is done."""

    def fail(self) -> None:
        """The current step failed (the verb's error says why)."""
        self.close()

    def __enter__(self) -> Reporter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if error is None or (isinstance(error, SystemExit) and not error.code):
            self.close()
        else:
            self.fail()


class PlainLines(Reporter):
    """Not a terminal: one line per step, `verb: step`."""

    def __init__(self, verb: str, *, stream: TextIO) -> None:
        self._verb = verb
        self._stream = stream

    def step(self, text: str, *, total: int | None = None) -> None:
        self._stream.write(f"{self._verb}: {text}\n")
        self._stream.flush()


class LiveDisplay(Reporter):
    """A terminal: rich's live progress; each finished step stays as a `✓` line."""

    def __init__(self, console: Console, *, keep_done: bool = True) -> None:
        self._console = console
        self._keep_done = keep_done
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self._task: TaskID | None = None
        self._text = ""
        self._started = 0.0
        self._progress.start()

    def _finish_step(self, *, failed: bool = False) -> None:
        if self._task is None:
            return
        seconds = time.monotonic() - self._started
        self._progress.remove_task(self._task)
        mark = f"[red]{FAILED_MARK}[/red]" if failed else f"[green]{DONE_MARK}[/green]"
        if self._keep_done or failed:
            self._progress.console.print(f"{mark} {self._text} ({seconds:.1f} s)", highlight=False)
        self._task = None

    def step(self, text: str, *, total: int | None = None) -> None:
        self._finish_step()
        self._text, self._started = text, time.monotonic()
        # No total: the bar pulses and the counter column stays empty.
        self._task = self._progress.add_task(text, total=total)

    def advance(self, amount: int = 1) -> None:
        if self._task is not None:
            self._progress.advance(self._task, amount)

    def echo(self, line: str, *, err: bool = False) -> None:
        if not self._progress.live.is_started:
            click.echo(line, err=err)
            return
        # Drawn by the display's console, above it: a line written past rich (click's own
        # stream) would land in the middle of the display's line. Stdout is this terminal too
        # (`open_progress`), so the line shows where it would have, either stream.
        self._progress.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def close(self) -> None:
        self._finish_step()
        self._progress.stop()

    def fail(self) -> None:
        self._finish_step(failed=True)
        self._progress.stop()


def quiet_option(command: click.decorators.FC) -> click.decorators.FC:
    """--quiet: no live display, even on a terminal (plain lines, as in a pipe)."""
    return click.option(
        "-q",
        "--quiet",
        is_flag=True,
        help="no live progress display: plain step lines on stderr, as when piped",
    )(command)


def stderr_console() -> Console:
    return Console(stderr=True)


def open_progress(
    verb: str,
    *,
    quiet: bool,
    plain_steps: bool = True,
    keep_done: bool = True,
    console: Console | None = None,
) -> Reporter:
    """The reporter for this invocation: a LiveDisplay on a terminal; with --quiet or off a
    terminal, PlainLines, or silence for a verb whose result lines already say each step
    (`plain_steps` False: apply, gitops sync). `keep_done` False: finished steps leave no
    line behind (a loop that would repeat them forever)."""
    console = console or stderr_console()
    # Live only when stdout is the same kind of thing: rich draws stdout's lines above the
    # display, which must not happen to a stdout piped into a file.
    if not quiet and console.is_terminal and sys.stdout.isatty():
        return LiveDisplay(console, keep_done=keep_done)
    return PlainLines(verb, stream=sys.stderr) if plain_steps else Reporter()
