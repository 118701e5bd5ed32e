"""What a board can report about itself, each reading optional and absent-safe.

psutil gives the portable readings; board-specific ones come from sysfs: the Raspberry Pi
firmware's throttling flags, thermal zones (Pi and Jetson alike), the default route's
interface for the link type. A reading a board lacks is `None`, never an error. No torch,
no Flower: this runs beside training on a small board and must stay light.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

# Raspberry Pi firmware flags (vcgencmd get_throttled): bits 0-3 are "happening now".
PI_THROTTLED_NOW = 0xF
_PI_THROTTLED_SYSFS = Path("/sys/devices/platform/soc/soc:firmware/get_throttled")
_THERMAL = Path("/sys/class/thermal")
_MODEL = Path("/proc/device-tree/model")
_JETSON = Path("/etc/nv_tegra_release")


def read_resources(cpu_percent: Callable[[], float] | None = None) -> dict[str, object]:
    """The dynamic part of a heartbeat; call it once per interval. `cpu_percent`: how busy the
    CPU the board trains on is (default: the whole machine's, from psutil)."""
    mem = psutil.virtual_memory()
    freq = _safe(psutil.cpu_freq)
    battery = _safe(psutil.sensors_battery)
    flags = throttle_flags()
    return {
        "cpu_percent": float(cpu_percent() if cpu_percent else psutil.cpu_percent(interval=None)),
        "load1": float(os.getloadavg()[0]),
        "mem_available_mb": mem.available / 2**20,
        "mem_total_mb": mem.total / 2**20,
        "cpu_freq_mhz": float(freq.current) if freq and freq.current > 0 else None,
        "temp_c": temperature_c(),
        "throttle_flags": flags,
        "throttled": bool(flags & PI_THROTTLED_NOW) if flags is not None else None,
        "battery_percent": float(battery.percent) if battery else None,
        "charging": bool(battery.power_plugged) if battery and battery.power_plugged is not None else None,
        "net_type": net_type(),
    }


def capabilities() -> dict[str, object]:
    """The static part: board, cores, memory, accelerator, software versions."""
    return {
        "board": board_model(),
        "cores": os.cpu_count() or 1,
        "ram_mb": psutil.virtual_memory().total / 2**20,
        "os": platform.platform(terse=True)[:128],
        "python": platform.python_version(),
        "accelerator": "nvidia-jetson" if _JETSON.exists() else None,
        "torch": _version("torch"),
        "onnxruntime": _version("onnxruntime"),
    }


class CgroupCpu:
    """How busy a cgroup keeps the CPU it may use: the load of a board whose training runs in a
    CPU-limited container or unit (its quota is the CPU it has, its other work competes within
    it), rather than the whole machine's. cgroup v2: the group's folder (`cpu.stat`, `cpu.max`);
    v1: its folder under the `cpu` controller, with the same group under `cpuacct`."""

    def __init__(self, group: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._group = group
        self._v1 = (group / "cpu.cfs_quota_us").exists()
        if self._v1:
            accounting = group / "cpuacct.usage"  # cpu and cpuacct mounted together
            if not accounting.exists():
                accounting = Path(str(group).replace("/cpu/", "/cpuacct/", 1)) / "cpuacct.usage"
            self._usage = lambda: int(accounting.read_text()) / 1e9
        else:
            stat = group / "cpu.stat"
            self._usage = lambda: next(int(line.split()[1]) for line in stat.read_text().splitlines()
                                       if line.startswith("usage_usec ")) / 1e6
        self._last = (self._clock(), self._usage())  # reads now: a group that cannot be read fails here
        self.cores()  # and so does one whose quota cannot

    def cores(self) -> float:
        """The CPU the group may use, in cores (read each time: a quota can change)."""
        if self._v1:
            quota, period = (int((self._group / f"cpu.cfs_{k}_us").read_text()) for k in ("quota", "period"))
        else:
            limit = (self._group / "cpu.max").read_text().split()
            quota, period = (-1 if limit[0] == "max" else int(limit[0])), int(limit[1])
        return quota / period if quota > 0 else float(os.cpu_count() or 1)

    def percent(self) -> float:
        """Use since the last call, as a percentage of the group's CPU."""
        now, used = self._clock(), self._usage()
        (then, before), self._last = self._last, (now, used)
        return min(100.0, 100.0 * (used - before) / max(now - then, 1e-6) / self.cores())


def board_model() -> str:
    try:
        return _MODEL.read_text().strip("\x00\n ")[:128] or platform.machine()
    except OSError:
        return platform.machine() or "unknown"


def temperature_c() -> float | None:
    """The hottest thermal zone (SoC zones on a Pi or Jetson), in degrees Celsius."""
    readings = []
    for zone in _THERMAL.glob("thermal_zone*/temp"):
        try:
            readings.append(int(zone.read_text()) / 1000.0)
        except (OSError, ValueError):
            continue
    readings = [t for t in readings if -60 < t < 150]
    return max(readings) if readings else None


def throttle_flags() -> int | None:
    """Raspberry Pi throttling flags from sysfs, or vcgencmd where sysfs lacks them."""
    try:
        return int(_PI_THROTTLED_SYSFS.read_text().strip(), 16)
    except (OSError, ValueError):
        pass
    if shutil.which("vcgencmd"):
        try:
            out = subprocess.run(["vcgencmd", "get_throttled"], capture_output=True, text=True, timeout=2).stdout
            return int(out.strip().split("=")[1], 16)
        except (OSError, IndexError, ValueError, subprocess.SubprocessError):
            return None
    return None


def net_type(route_table: Path = Path("/proc/net/route")) -> str:
    """ethernet / wifi / cellular from the default route's interface name."""
    try:
        for line in route_table.read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) > 1 and fields[1] == "00000000":
                return classify_interface(fields[0])
    except OSError:
        pass
    return "unknown"


def classify_interface(name: str) -> str:
    if name.startswith(("wl", "wifi", "ath", "ra")):
        return "wifi"
    if name.startswith(("wwan", "rmnet", "ppp", "usb", "ccmni")):
        return "cellular"
    if name.startswith(("eth", "en", "em", "veth", "br")):
        return "ethernet"
    return "unknown"


def _version(package: str) -> str | None:
    """A package's version without importing it (importing torch costs ~1 s and ~200 MB)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _safe(probe: Callable[[], Any]) -> Any:
    try:
        return probe()
    except (OSError, AttributeError, NotImplementedError, RuntimeError):
        return None
