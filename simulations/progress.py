"""Live progress for long runs: a bar on a terminal, one plain line per round otherwise."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from edgesched.core.records import JobRecord, RoundRecord


class RoundProgress:
    """Context manager that shows round, accuracy, loss and elapsed time as rounds finish."""

    def __init__(self, total_rounds: int, console: Console | None = None, done: int = 0,
                 starting: str = "starting the simulation engine") -> None:
        """`done`: rounds a resumed run had finished before it stopped; `starting`: what the wait
        for the first round is."""
        self.starting = starting
        self.console = console or Console(stderr=True)
        self.total = total_rounds
        self.done = done
        self._start = time.monotonic()
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("round {task.completed}/{task.total}"),
            TextColumn("acc {task.fields[acc]}  loss {task.fields[loss]}"),
            TimeElapsedColumn(),
            console=self.console,
            disable=not self.console.is_terminal,
        )
        self._task = self._progress.add_task(starting, total=total_rounds, completed=done, acc="-", loss="-")

    def __enter__(self) -> RoundProgress:
        if not self.console.is_terminal:
            self.console.print(f"{self.starting}; {self.total - self.done} rounds to go")
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def on_round(self, record: RoundRecord, jobs: list[JobRecord]) -> None:
        acc, loss = f"{record.accuracy:.2%}", f"{record.loss:.3f}"
        self._progress.update(self._task, completed=record.round, acc=acc, loss=loss, description="training")
        if not self.console.is_terminal:
            elapsed = time.monotonic() - self._start
            virtual = f"  virtual {record.virtual_seconds:.0f} s" if record.virtual_seconds is not None else ""
            self.console.print(
                f"round {record.round}/{self.total}  acc {acc}  loss {loss}  "
                f"{record.selected} sent, {record.replied} in{virtual}  {elapsed:.0f} s"
            )
