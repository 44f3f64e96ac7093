"""The dependency rules of DESIGN.md: the edge runtime needs neither torch nor the cloud."""

from __future__ import annotations

import subprocess
import sys

EDGE_MODULES = [
    "edge.node",
    "edge.replay",
    "edge.mcbank",
    "edge.pipeline",
    "edge.sources",
    "edge.camera_server",
    "models.bundle",
    "filterforward.cli",
]


def test_edge_runtime_imports_no_torch_and_no_cloud() -> None:
    code = (
        f"import importlib, sys\nfor name in {EDGE_MODULES!r}: importlib.import_module(name)\n"
        "from filterforward.cli import build_parser; build_parser()\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'cloud', 'fastapi'))\n"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
