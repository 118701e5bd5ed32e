"""Benchmark: heartbeats into the gateway registry through a real Mosquitto.

Three figures, all on loopback:
1. ingest rate: simulated devices publish as fast as they can (a separate process, so the
   gateway's process has its own core); heartbeats validated and applied per second, and
   the gateway's CPU time per heartbeat (one core's capacity is 1e6 / that).
2. latency at a steady offered load: every device beats once a second, phases spread over
   the second; p50/p99 of (registry applied it) - (device stamped sent_at).
3. the real agent process at 1 Hz: CPU % of one core and resident memory.

    python -m benchmarks.telemetry --devices 5000
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import psutil
from paho.mqtt.enums import CallbackAPIVersion

from benchmarks.processes import stop_on_sigterm
from edgesched.broker import free_port
from edgesched.core.registry import DeviceRegistry, RegistryConfig, _Device
from edgesched.core.telemetry import Heartbeat, topic
from edgesched.mqtt import BrokerURL, RegistryListener


class TimedRegistry(DeviceRegistry):
    """Records, for every applied heartbeat, the seconds from the device's stamp to the registry."""

    def __init__(self, config: RegistryConfig) -> None:
        super().__init__(config)
        self.applied: list[tuple[float, float]] = []  # (applied at, latency)

    def _heartbeat(self, device: _Device, hb: Heartbeat, now: float) -> None:
        super()._heartbeat(device, hb, now)
        self.applied.append((now, now - hb.sent_at))


def _template(device_id: str) -> tuple[bytes, bytes]:
    """A device's heartbeat split around seq and sent_at, so publishers can stamp them cheaply."""
    hb = Heartbeat(device_id=device_id, session=1, seq=1, sent_at=1.0, cpu_percent=37.5, load1=1.2,
                   mem_available_mb=1400.0, mem_total_mb=3800.0, cpu_freq_mhz=1500.0, temp_c=61.3, throttled=False,
                   throttle_flags=0, net_type="wifi", rtt_ms=4.2, train_samples_per_s=410.0, last_job_s=31.0)
    head, tail = hb.to_json().split(b'"seq":1,"sent_at":1.0')
    return head, tail


def publish(port: int, devices: int, rounds: int, paced: bool, first_seq: int, done: mp.Event) -> None:
    """Publisher process: `rounds` heartbeats from each of `devices`, QoS 0, over 4 connections."""
    clients = []
    for i in range(4):
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-pub-{i}-{first_seq}")
        client.max_queued_messages_set(0)
        client.connect("127.0.0.1", port)
        client.loop_start()
        clients.append(client)
    ids = [f"sim-{n:05d}" for n in range(devices)]
    templates = [_template(d) for d in ids]
    topics = [topic("bench", d, "heartbeat") for d in ids]
    start = time.monotonic()
    for r in range(rounds):
        seq = first_seq + r
        for n in range(devices):
            if paced and n % 50 == 0:  # devices beat at spread-out phases, as real ones do
                time.sleep(max(0.0, start + r + n / devices - time.monotonic()))
            head, tail = templates[n]
            payload = b"%s\"seq\":%d,\"sent_at\":%.6f%s" % (head, seq, time.time(), tail)
            clients[n % 4].publish(topics[n], payload, qos=0)
    time.sleep(0.5)
    for client in clients:
        client.loop_stop()
        client.disconnect()
    done.set()


def _run_publisher(port: int, devices: int, rounds: int, paced: bool, first_seq: int) -> None:
    done = mp.get_context("spawn").Event()
    proc = mp.get_context("spawn").Process(target=publish, args=(port, devices, rounds, paced, first_seq, done))
    proc.start()
    proc.join(timeout=rounds * 10 + 120)
    if proc.is_alive():
        proc.kill()
        raise RuntimeError("the publisher process hung")


def _settle(registry: TimedRegistry, expected: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last, quiet_since = -1, time.monotonic()
    while time.monotonic() < deadline and len(registry.applied) < expected:
        if len(registry.applied) != last:
            last, quiet_since = len(registry.applied), time.monotonic()
        elif time.monotonic() - quiet_since > 3:
            break
        time.sleep(0.1)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_ingest(port: int, devices: int, rounds: int) -> dict[str, float]:
    registry = TimedRegistry(RegistryConfig(fleet="bench", burst=1e9, rate_per_second=1e9, max_devices=10**6))
    with RegistryListener(registry, BrokerURL.parse(f"mqtt://127.0.0.1:{port}")) as listener:
        listener.wait_connected(10)
        me = psutil.Process()
        cpu_before = sum(me.cpu_times()[:2])
        _run_publisher(port, devices, rounds, paced=False, first_seq=1)
        _settle(registry, devices * rounds, timeout=120)
        cpu_used = sum(me.cpu_times()[:2]) - cpu_before
        flood = [t for t, _ in registry.applied]
        registry.applied.clear()
        _run_publisher(port, devices, 10, paced=True, first_seq=rounds + 1)
        _settle(registry, devices * 10, timeout=60)
        latencies = [lat for _, lat in registry.applied]
    sent = devices * rounds
    return {
        "devices": devices,
        "flood_sent": sent,
        "flood_applied": len(flood),
        "ingest_per_s": (len(flood) - 1) / (max(flood) - min(flood)) if len(flood) > 1 else 0.0,
        # CPU the gateway process spent per heartbeat: 1e6 / this = what one core can ingest.
        "gateway_cpu_us_per_heartbeat": 1e6 * cpu_used / max(len(flood), 1),
        "steady_offered_per_s": float(devices),
        "steady_applied": len(latencies),
        "latency_p50_ms": 1000 * _percentile(latencies, 0.50) if latencies else float("nan"),
        "latency_p99_ms": 1000 * _percentile(latencies, 0.99) if latencies else float("nan"),
        "dropped": dict(registry.dropped),
    }


def bench_agent(port: int, seconds: float) -> dict[str, float]:
    state = tempfile.mkdtemp()
    cmd = [sys.executable, "-m", "edgesched", "agent", "--broker", f"mqtt://127.0.0.1:{port}", "--device-id",
           "bench-agent", "--interval", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={"EDGESCHED_STATE_DIR": state, "PATH": "/usr/bin:/bin"})
    try:
        handle = psutil.Process(proc.pid)
        time.sleep(5)  # start-up (imports) is not the steady state
        before, t0 = handle.cpu_times(), time.monotonic()
        time.sleep(seconds)
        after, elapsed = handle.cpu_times(), time.monotonic() - t0
        cpu = (after.user + after.system - before.user - before.system) / elapsed
        return {"agent_cpu_percent": 100 * cpu, "agent_rss_mb": handle.memory_info().rss / 2**20,
                "agent_seconds_measured": elapsed}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(state, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=5000, help="simulated devices (default 5000)")
    parser.add_argument("--rounds", type=int, default=6, help="heartbeats per device in the flood phase")
    parser.add_argument("--agent-seconds", type=float, default=30.0, help="how long to measure the agent")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    stop_on_sigterm()
    mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(mosquitto).exists():
        sys.exit("benchmarks.telemetry: error: needs mosquitto (apt-get install mosquitto)")
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        conf = Path(folder) / "mosquitto.conf"
        conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                        "max_queued_messages 0\nmax_inflight_messages 0\nuser root\n")
        broker = subprocess.Popen([mosquitto, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            figures = {"machine": f"{platform.processor() or platform.machine()}, {psutil.cpu_count()} cores, "
                                  f"Python {platform.python_version()}",
                       **bench_ingest(port, args.devices, args.rounds), **bench_agent(port, args.agent_seconds)}
        finally:
            broker.terminate()
            broker.wait(timeout=10)
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
