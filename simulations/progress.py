"""Live progress for long runs: a bar on a terminal, one plain line per round otherwise."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from edgesched.core.records import JobRecord, RoundRecord


class RoundProgress:
    """Context manager that shows round, accuracy, loss and elapsed time as rounds finish.

    With a time budget the bar measures virtual seconds against it: a budgeted run's step cap is
    only a backstop (the benchmark sets a million), so counting rounds against it says nothing."""

    def __init__(self, total_rounds: int, console: Console | None = None, done: int = 0,
                 starting: str = "starting the simulation engine", time_budget: float | None = None) -> None:
        """`done`: rounds a resumed run had finished before it stopped; `starting`: what the wait
        for the first round is; `time_budget`: the run's virtual seconds, if it has a budget."""
        self.starting = starting
        self.console = console or Console(stderr=True)
        self.total = total_rounds
        self.done = done
        self.budget = time_budget
        self._start = time.monotonic()
        measure = ("virtual {task.completed:.0f}/{task.total:.0f} s" if time_budget
                   else "round {task.completed}/{task.total}")
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn(measure),
            TextColumn("acc {task.fields[acc]}  loss {task.fields[loss]}"),
            TimeElapsedColumn(),
            console=self.console,
            disable=not self.console.is_terminal,
        )
        self._task = self._progress.add_task(starting, total=time_budget or total_rounds,
                                             completed=0 if time_budget else done, acc="-", loss="-")

    def __enter__(self) -> RoundProgress:
        if not self.console.is_terminal:
            left = (f"until {self.budget:g} virtual s" if self.budget else f"{self.total - self.done} rounds to go")
            self.console.print(f"{self.starting}; {left}")
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def on_round(self, record: RoundRecord, jobs: list[JobRecord]) -> None:
        acc, loss = f"{record.accuracy:.2%}", f"{record.loss:.3f}"
        virtual = record.virtual_seconds
        completed = min(virtual or 0.0, self.budget) if self.budget else record.round
        self._progress.update(self._task, completed=completed, acc=acc, loss=loss, description="training")
        if not self.console.is_terminal:
            elapsed = time.monotonic() - self._start
            where = f"round {record.round}" if self.budget else f"round {record.round}/{self.total}"
            if virtual is not None:
                where += f"  virtual {virtual:.0f}" + (f"/{self.budget:g} s" if self.budget else " s")
            self.console.print(f"{where}  acc {acc}  loss {loss}  {record.selected} sent, {record.replied} in  "
                               f"{elapsed:.0f} s")
