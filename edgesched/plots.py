"""The run directory's pictures: accuracy against rounds or virtual time, the scheduler's decisions,
and who trained when on a virtual fleet (drawn from events.jsonl)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgesched.core.decisions import Arrived, Decision, Expired, Lost, RoundPlanned
from edgesched.core.events import event_from_json
from edgesched.core.records import RoundRecord
from edgesched.observe import JobSpans

MAX_DEVICES = 40  # timeline rows drawn: the devices that worked most, so the picture stays readable


def plot_accuracy(rounds: list[RoundRecord], path: Path, virtual_time: bool = False) -> None:
    """Test accuracy and loss of the global model per round (or per virtual hour), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    x = [(r.virtual_seconds or 0.0) / 3600 if virtual_time else r.round for r in rounds]
    fig, acc_ax = plt.subplots(figsize=(7, 4), dpi=110)
    acc_ax.plot(x, [100 * r.accuracy for r in rounds], "o-", color="tab:blue", label="test accuracy")
    if virtual_time:
        acc_ax.set_xlabel("virtual time (hours)")
    else:
        acc_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        acc_ax.set_xlabel("round")
    acc_ax.set_ylabel("test accuracy (%)", color="tab:blue")
    acc_ax.grid(alpha=0.3)
    loss_ax = acc_ax.twinx()
    loss_ax.plot(x, [r.loss for r in rounds], "s--", color="tab:red", alpha=0.7, label="test loss")
    loss_ax.set_ylabel("test loss", color="tab:red")
    acc_ax.set_title("global model on the held-out test set")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_decisions(log: list[Decision], path: Path) -> None:
    """Three panels: predicted vs actual job time; per round the deadline and what became of
    the jobs; the prediction error per round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arrived = [e for e in log if isinstance(e, Arrived)]
    rounds = [e for e in log if isinstance(e, RoundPlanned)]
    fig, (ax_pred, ax_round, ax_err) = plt.subplots(1, 3, figsize=(14, 4), dpi=110)
    if arrived:
        actual = [e.actual_s for e in arrived]
        ax_pred.scatter(actual, [e.predicted_s for e in arrived], s=6, alpha=0.5, c=[e.round for e in arrived],
                        cmap="viridis")
        both = actual + [e.predicted_s for e in arrived]
        low, top = max(min(both), 1e-3), max(both)
        ax_pred.plot([low, top], [low, top], color="grey", linewidth=0.8)
        ax_pred.set(xscale="log", yscale="log")
    ax_pred.set(xlabel="actual job time (s)", ylabel="planned (upper-quantile) time (s)",
                title="prediction vs outcome (colour: round)")
    by_round: dict[int, dict[str, int]] = {}
    for e in log:
        if isinstance(e, Arrived | Lost | Expired):
            counts = by_round.setdefault(e.arrived_round, {})
            counts[e.outcome] = counts.get(e.outcome, 0) + 1
    xs = sorted({r.round for r in rounds})
    deadline = {r.round: r.deadline_s for r in rounds}
    bottom = np.zeros(len(xs))
    for outcome, colour in (("counted", "tab:green"), ("too_stale", "tab:orange"), ("expired", "tab:purple"),
                            ("lost", "tab:red")):
        heights = np.array([by_round.get(x, {}).get(outcome, 0) for x in xs], dtype=float)
        ax_round.bar(xs, heights, bottom=bottom, color=colour, label=outcome)
        bottom += heights
    ax_round.set(xlabel="round", ylabel="jobs ending in the round", title="jobs and deadline per round")
    ax_round.legend(fontsize=7, loc="upper left")
    ax_dl = ax_round.twinx()
    ax_dl.plot(xs, [deadline[x] for x in xs], "k.-", linewidth=0.8)
    ax_dl.set_ylabel("deadline (s)")
    errors: dict[int, list[float]] = {}
    for e in arrived:
        errors.setdefault(e.round, []).append(100 * abs(e.error))
    ex = sorted(errors)
    ax_err.plot(ex, [float(np.median(errors[x])) for x in ex], "o-", color="tab:blue")
    ax_err.set(xlabel="round", ylabel="median |error| (%)", title="job-time prediction error")
    ax_err.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_timeline(events_path: Path, png: Path) -> None:
    """Per device, each job from dispatch to delivery (late or not) or drop, and the steps' ends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jobs = JobSpans()
    for line in events_path.read_text().splitlines():
        jobs.event(*event_from_json(line))
    spans, step_ends = list(jobs.spans), jobs.step_ends
    work: dict[str, int] = {}
    for device, *_ in spans:
        work[device] = work.get(device, 0) + 1
    shown = sorted(sorted(work, key=lambda d: -work[d])[:MAX_DEVICES])
    row = {d: i for i, d in enumerate(shown)}
    colours = {"delivered": "tab:green", "late": "tab:orange", "dropped": "tab:red"}
    fig, ax = plt.subplots(figsize=(9, max(3, 0.22 * len(shown) + 1.5)), dpi=110)
    # Jobs of seconds in rounds of minutes would be thinner than a pixel: draw at least 0.4 %.
    span = max([end for _, _, end, _ in spans] + step_ends + [1e-9])
    for device, start, end, outcome in spans:
        if device in row:
            ax.barh(row[device], max(end - start, 0.004 * span), left=start, height=0.6, color=colours[outcome])
            if outcome == "dropped":
                ax.plot(end, row[device], "x", color="black", markersize=4)
    for t in step_ends:
        ax.axvline(t, color="grey", linewidth=0.5, alpha=0.6)
    ax.set_yticks(range(len(shown)), shown, fontsize=6)
    ax.set_xlabel("virtual time (s); grey lines end rounds")
    ax.set_title(f"jobs per device (the {len(shown)} busiest): delivered, late, dropped (x)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    ax.legend(handles, list(colours), loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)


def plot_compare(curves: dict[str, tuple[list[float], list[float]]], target: float, title: str, path: Path) -> None:
    """Test accuracy against virtual time, one line per strategy, with the target marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for label, (seconds, accuracy) in curves.items():
        ax.plot(seconds, [100 * a for a in accuracy], ".-", label=label, markersize=4)
    ax.axhline(100 * target, color="grey", linestyle="--", linewidth=0.8, label=f"target {target:.0%}")
    ax.set(xlabel="virtual seconds", ylabel="test accuracy (%)", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
