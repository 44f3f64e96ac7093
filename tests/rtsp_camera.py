"""A live RTSP camera for tests: GStreamer's RTSP server (tests/rtsp_server.py) run by Debian's python3, which
has `gi`; tests that need it skip with the apt-get line where it is missing."""

from __future__ import annotations

import select
import signal
import subprocess
from pathlib import Path

import pytest

RTSP_SERVER = Path(__file__).with_name("rtsp_server.py")
SYSTEM_PYTHON = "/usr/bin/python3"
APT_PACKAGES = (
    "gstreamer1.0-rtsp gir1.2-gst-rtsp-server-1.0 python3-gi python3-gst-1.0"
    " gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-bad"
)
LOOP_FRAMES = 60  # the server loops the clip's first frames by default
WAIT_S = 20.0  # upper bound for every wait; only a broken camera ever reaches it

PROBE = """
import gi
gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import Gst, GstRtspServer
Gst.init(None)
missing = [name for name in ("qtdemux", "h264parse", "rtph264pay", "appsrc") if not Gst.ElementFactory.find(name)]
if missing:
    raise SystemExit("missing GStreamer elements: " + ", ".join(missing))
"""


def rtsp_server_missing() -> str:
    """Why the RTSP server can't run here, or '' if it can."""
    try:
        probe = subprocess.run([SYSTEM_PYTHON, "-c", PROBE], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{SYSTEM_PYTHON} can't run ({error})"
    lines = probe.stderr.strip().splitlines()
    return "" if probe.returncode == 0 else (lines[-1] if lines else f"the probe exited with {probe.returncode}")


def require_rtsp_server() -> None:
    """Skip the calling test (module, from an autouse fixture) when the RTSP server cannot run here."""
    if missing := rtsp_server_missing():
        pytest.skip(f"GStreamer's RTSP server is unavailable ({missing}); apt-get install -y {APT_PACKAGES}")


class RtspCamera:
    """The RTSP server script as a separate process on 127.0.0.1; restarts keep the port."""

    def __init__(self, clip: Path, port: int, user: str | None = None, frames: int = LOOP_FRAMES) -> None:
        self.clip, self.port, self.user, self.frames = clip, port, user, frames
        self.process: subprocess.Popen[str] | None = None
        self.pushed: int | None = None  # frames the last stopped server fed its clients (None: it said nothing)

    def url(self, credentials: str | None = None) -> str:
        login = f"{credentials}@" if credentials else ""
        return f"rtsp://{login}127.0.0.1:{self.port}/cam"

    def start(self) -> None:
        command = [SYSTEM_PYTHON, str(RTSP_SERVER), "--clip", str(self.clip), "--port", str(self.port)]
        command += ["--frames", str(self.frames), *(["--user", self.user] if self.user else [])]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.process.stdout], [], [], WAIT_S)
        assert ready and self.process.stdout.readline().strip() == "ready", "the RTSP server did not start"

    def stop(self) -> None:
        """SIGTERM, like a camera shutting down; the server must exit cleanly on it (and say how many frames it
        fed its clients, kept in `pushed`)."""
        if self.process is None:
            return
        process, self.process = self.process, None
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
        said = process.stdout.read().split()
        process.stdout.close()
        self.pushed = int(said[-1]) if said[:1] == ["pushed"] else None
        assert code == 0, f"the RTSP server exited with {code} on SIGTERM"
