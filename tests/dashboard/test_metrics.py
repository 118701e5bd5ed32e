"""The Prometheus collector on a run directory, and the shipped Grafana dashboard against it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from edgesched.core.decisions import Arrived
from edgesched.dashboard.metrics import RunCollector
from edgesched.observe import FLEET_FILE, RunWatch

from .test_observe import JOB_HEADER, ROUND_HEADER

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "gateway" / "grafana-edgesched.json"


def _run_dir(path: Path) -> Path:
    (path / "config.json").write_text(json.dumps({"strategy": "edgesched", "rounds": 2, "fleet": "f"}))
    (path / "rounds.csv").write_text(ROUND_HEADER + "1,0.5,1.2,1.5,3,2,1,1000,10.0,4.0\n2,0.625,1.0,1.1,2,2,0,900,"
                                                    "22.5,9.0\n")
    (path / "jobs.csv").write_text(JOB_HEADER + "1,0,1,pi-a,500,8,2.0,250.0,1.4\n1,1,2,pi-b,500,8,2.0,250.0,1.4\n")
    (path / "decisions.jsonl").write_text(Arrived(4.0, 1, "pi-a", "too_stale", 2, 1, 1, 3.0, 2.0, 0.5, 500).to_json()
                                          + "\n")
    (path / FLEET_FILE).write_text(json.dumps({
        "t": 9.0, "step": 2, "heartbeats": {"accepted": 40, "dropped": {"replayed": 3}}, "bytes": {"down": 7, "up": 6},
        "devices": [{"device": "pi-a", "state": "training"}, {"device": "pi-b", "state": "offline"}]}))
    return path


def _scrape(path: Path) -> dict[str, float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(RunWatch(path)))
    text = generate_latest(registry).decode()
    return {f"{s.name}{json.dumps(s.labels, sort_keys=True) if s.labels else ''}": s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_each_family_says_what_the_run_directory_says(tmp_path):
    scraped = _scrape(_run_dir(tmp_path))
    assert scraped["edgesched_step"] == 2 and scraped["edgesched_accuracy"] == 0.625
    assert scraped['edgesched_devices{"state": "training"}'] == 1
    assert scraped['edgesched_devices{"state": "offline"}'] == 1
    assert scraped["edgesched_jobs_sent_total"] == 5 and scraped["edgesched_jobs_counted_total"] == 2
    assert scraped["edgesched_jobs_failed_total"] == 1 and scraped["edgesched_jobs_late_total"] == 1
    assert scraped['edgesched_heartbeats_dropped_total{"reason": "replayed"}'] == 3
    assert scraped['edgesched_bytes_total{"direction": "down"}'] == 7
    assert scraped['edgesched_step_duration_seconds_sum{"clock": "wall"}'] == 22.5
    assert scraped['edgesched_step_duration_seconds_bucket{"clock": "virtual", "le": "5.0"}'] == 2  # 4 s and 5 s
    assert scraped['edgesched_step_duration_seconds_bucket{"clock": "wall", "le": "10.0"}'] == 1
    # A late arrival's time was predicted too: 3.0 s predicted against 2.0 s, an error of 0.5.
    assert scraped["edgesched_prediction_error_ratio"] == 0.5
    assert scraped['edgesched_run_info{"fleet": "f", "run": "' + tmp_path.name + '", "status": "running", '
                   '"strategy": "edgesched"}'] == 1


def test_the_shipped_grafana_dashboard_asks_only_for_what_is_exposed(tmp_path):
    exposed = {key.split("{")[0] for key in _scrape(_run_dir(tmp_path))}
    dashboard = json.loads(GRAFANA.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    asked = {name for expr in exprs for name in re.findall(r"edgesched_[a-z_]+", expr)}
    assert len(exprs) >= 8 and asked and asked <= exposed, asked - exposed
