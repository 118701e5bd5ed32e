"""The core stays pure: every module of edgesched.core imports with Flower, torch, MQTT, plotting
and the CLI libraries made unimportable, and loads nothing beyond numpy and the standard library."""

from __future__ import annotations

import subprocess
import sys

BLOCKED = ("flwr", "torch", "paho", "matplotlib", "ray", "sklearn", "onnx", "onnxruntime", "typer", "rich", "amqtt")

PROBE = f"""
import importlib, pkgutil, sys

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError(f"{{name}} must not be imported by the core")

sys.meta_path.insert(0, Blocked())
stdlib = set(sys.stdlib_module_names)
import edgesched.core
for module in pkgutil.walk_packages(edgesched.core.__path__, "edgesched.core."):
    importlib.import_module(module.name)
loaded = {{name.split(".")[0] for name in sys.modules if not name.startswith(("__", "_distutils"))}}
print(sorted(loaded - stdlib - {{"edgesched", "numpy"}}))
"""


def test_the_core_imports_without_flower_torch_mqtt_or_plotting():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", f"the core loaded {done.stdout.strip()}"
