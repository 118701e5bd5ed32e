"""The time model reproduces the measurements it was calibrated on (../shared/data)."""

import csv
import json
import statistics
from pathlib import Path

import pytest

from edgesched.simulations.catalog import load_catalog

DEVICES = Path(__file__).resolve().parents[3] / "shared" / "data" / "devices"
RPI = {
    "rpi4": ("rpi_bench/rpi4_train_finetune_bench.csv", "t_train_batch"),
    "rpi5": ("rpi_bench/rpi5_partial_train_finetune_bench.csv", "t_train_batch_s"),
}


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"calibration data {path} is not on this machine")
    return path


@pytest.mark.parametrize("board", sorted(RPI))
def test_time_model_reproduces_the_measured_batch_time(board):
    file, column = RPI[board]
    rows = {r["model"]: r for r in csv.DictReader(_need(DEVICES / file).open())}
    ref = rows["resnet18"]
    batch, gmacs, measured = int(ref["batch"]), float(ref["gmacs"]), float(ref[column])
    predicted = load_catalog().boards[board].train_seconds(int(gmacs * 1e9), batch)
    assert predicted == pytest.approx(measured, rel=0.01)


@pytest.mark.parametrize("tier", [("phone-low", 0), ("phone-mid", 1), ("phone-high", 2)])
def test_phone_tiers_follow_from_the_ai_benchmark_scores(tier):
    name, third = tier
    phones = json.loads(_need(DEVICES / "ai_benchmark/raw_ai_benchmark_list.json").read_text())
    scores = sorted(float(p["CPU_F_AI_Score"]) for p in phones if p["CPU_F_AI_Score"].strip())
    a76 = [float(p["CPU_F_AI_Score"]) for p in phones
           if any(soc in p["CPU"] for soc in ("Snapdragon 855", "Kirin 980", "Kirin 990"))]
    n = len(scores)
    tier_median = statistics.median(scores[third * n // 3:(third + 1) * n // 3])
    catalog = load_catalog()
    expected = tier_median / statistics.median(a76) * catalog.boards["rpi5"].gmacs_per_s
    assert catalog.boards[name].gmacs_per_s == pytest.approx(expected, rel=0.01)


def test_jetsons_follow_datasheet_peaks_and_the_measured_pi_efficiency():
    boards = load_catalog().boards
    efficiency = statistics.mean([boards["rpi4"].gmacs_per_s / 48.0, boards["rpi5"].gmacs_per_s / 76.8])
    assert efficiency == pytest.approx(0.18, abs=0.005)
    for name, cores, ghz in (("jetson-nano", 128, 0.9216), ("jetson-xavier-nx", 384, 1.1),
                             ("jetson-orin-nano", 1024, 0.625)):
        assert boards[name].gmacs_per_s == pytest.approx(cores * ghz * 0.18, rel=0.01)
        assert not boards[name].measured


def test_flash_links_are_the_measured_distributions():
    measured = json.loads(_need(DEVICES / "ai_benchmark/speed_distri.json").read_text())
    shipped = load_catalog().flash_clients
    expected = [(v["down_u"], v["down_sigma"], v["up_u"], v["up_sigma"]) for v in measured.values()]
    assert len(shipped) == 19
    for got, want in zip(shipped, expected, strict=True):
        assert got == pytest.approx(want, abs=0.051)  # shipped to one decimal
