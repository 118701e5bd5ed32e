"""The per-device timeline of a fleet run, drawn from its events.jsonl: who trained when, who dropped."""

from __future__ import annotations

import json
from pathlib import Path

MAX_DEVICES = 40  # rows drawn: the devices that worked most, so the picture stays readable


def plot_timeline(events_path: Path, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = [json.loads(line) for line in events_path.read_text().splitlines()]
    started: dict[tuple[str, int], float] = {}
    spans: list[tuple[str, float, float, str]] = []  # device, start, end, outcome
    round_ends = []
    for e in events:
        key = (e.get("device", ""), e.get("round", 0))
        if e["event"] == "dispatch":
            started[key] = e["t"]
        elif e["event"] in ("upload", "dropout") and key in started:
            outcome = "dropped" if e["event"] == "dropout" else ("late" if e.get("late") else "delivered")
            spans.append((key[0], started.pop(key), e["t"], outcome))
        elif e["event"] == "round_end":
            round_ends.append(e["t"])
    work: dict[str, int] = {}
    for device, *_ in spans:
        work[device] = work.get(device, 0) + 1
    shown = sorted(sorted(work, key=lambda d: -work[d])[:MAX_DEVICES])
    row = {d: i for i, d in enumerate(shown)}
    colours = {"delivered": "tab:green", "late": "tab:orange", "dropped": "tab:red"}
    fig, ax = plt.subplots(figsize=(9, max(3, 0.22 * len(shown) + 1.5)), dpi=110)
    # Jobs of seconds in rounds of minutes would be thinner than a pixel: draw at least 0.4 %.
    span = max([end for _, _, end, _ in spans] + round_ends + [1e-9])
    for device, start, end, outcome in spans:
        if device in row:
            ax.barh(row[device], max(end - start, 0.004 * span), left=start, height=0.6, color=colours[outcome])
            if outcome == "dropped":
                ax.plot(end, row[device], "x", color="black", markersize=4)
    for t in round_ends:
        ax.axvline(t, color="grey", linewidth=0.5, alpha=0.6)
    ax.set_yticks(range(len(shown)), shown, fontsize=6)
    ax.set_xlabel("virtual time (s); grey lines end rounds")
    ax.set_title(f"jobs per device (the {len(shown)} busiest): delivered, late, dropped (x)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    ax.legend(handles, list(colours), loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
