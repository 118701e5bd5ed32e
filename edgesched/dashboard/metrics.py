"""Prometheus metrics of a run, read from its directory at each scrape (edgesched.observe).

A custom collector rather than counters bumped by the run: the figures are the run directory's
own, so a scrape during a run and the files at its end cannot disagree, and a finished run's
directory serves the same families. Family names are documented in docs/dashboard.md; the
Grafana dashboard in deploy/gateway/ is built on them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from edgesched.observe import STATES, RunWatch

STEP_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, float("inf"))


class RunCollector(Collector):
    def __init__(self, watch: RunWatch) -> None:
        self.watch = watch

    def collect(self) -> Iterator[Metric]:
        self.watch.refresh()
        view = self.watch.view()
        run = view["run"]
        info = GaugeMetricFamily("edgesched_run_info", "The run being watched (always 1)",
                                 labels=["run", "strategy", "fleet", "status"])
        info.add_metric([run["name"], str(run["strategy"]), str(run["fleet"] or ""), run["status"]], 1)
        yield info
        yield GaugeMetricFamily("edgesched_step", "The last server step (round) taken", value=run["step"])
        if run["steps"] is not None:
            yield GaugeMetricFamily("edgesched_steps_planned", "Server steps the run is set to take",
                                    value=run["steps"])
        seconds = GaugeMetricFamily("edgesched_run_seconds", "Seconds since the run started, at its last step",
                                    labels=["clock"])
        seconds.add_metric(["wall"], run["wall_seconds"] or 0.0)
        if run["clock"] == "virtual":
            seconds.add_metric(["virtual"], run["t"] or 0.0)
        yield seconds
        devices = GaugeMetricFamily("edgesched_devices", "Devices by state", labels=["state"])
        for state in STATES:
            devices.add_metric([state], view["counts"][state])
        yield devices
        yield from _heartbeats(view["heartbeats"])
        for name in ("sent", "counted", "failed", "late"):
            yield CounterMetricFamily(f"edgesched_jobs_{name}", f"Jobs {name}", value=view["jobs"][name])
        yield _durations(view["step_seconds"])
        if view["prediction_error"] is not None:
            yield GaugeMetricFamily("edgesched_prediction_error_ratio",
                                    "Median |predicted / actual - 1| of the job times that came back",
                                    value=view["prediction_error"])
        curve = view["accuracy"]
        if curve["accuracy"]:
            yield GaugeMetricFamily("edgesched_accuracy", "The global model's test accuracy (0-1)",
                                    value=curve["accuracy"][-1])
            yield GaugeMetricFamily("edgesched_loss", "The global model's test loss", value=curve["loss"][-1] or 0.0)
        if view["bytes"] is not None:
            moved = CounterMetricFamily("edgesched_bytes", "Model bytes moved over the devices' links",
                                        labels=["direction"])
            for direction in ("down", "up"):
                moved.add_metric([direction], view["bytes"][direction])
            yield moved


def _heartbeats(counts: dict[str, Any]) -> Iterator[Metric]:
    yield CounterMetricFamily("edgesched_heartbeats_accepted", "Telemetry messages the registry took in",
                              value=counts["accepted"])
    dropped = CounterMetricFamily("edgesched_heartbeats_dropped", "Telemetry messages dropped, by reason",
                                  labels=["reason"])
    for reason, count in counts["dropped"].items():
        dropped.add_metric([reason], count)
    yield dropped


def _durations(steps: dict[str, list[float]]) -> HistogramMetricFamily:
    family = HistogramMetricFamily("edgesched_step_duration_seconds", "Server step durations", labels=["clock"])
    for clock, durations in steps.items():
        if durations:
            buckets = [(_le(le), sum(1 for d in durations if d <= le)) for le in STEP_BUCKETS]
            family.add_metric([clock], buckets, sum(durations))
    return family


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else str(bound)
