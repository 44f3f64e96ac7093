"""An edge node: one base DNN and one MC bank shared by all configured cameras, each in its own thread."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from edge.basednn import BaseDNN
from edge.config import CameraConfig, EdgeConfig
from edge.filtersync import FilterSync
from edge.mcbank import MCBank
from edge.pipeline import CameraPipeline
from edge.sink import FolderSink, Sink
from edge.sources import open_source
from edge.uplink import Uplink
from models.bundle import load_bundle
from models.filterspec import FilterSpec

log = logging.getLogger(__name__)


def load_filters(bank: MCBank, bundles: list[Path]) -> list[tuple[FilterSpec, bytes]]:
    filters = [load_bundle(path) for path in bundles]
    bank.put_many(filters)
    return filters


class EdgeNode:
    """Runs every camera until its source ends or `stop()` is called; logs per-camera stats periodically.

    With a `cloud` link configured (and no sink given), matched frames go to the cloud through the uplink
    and the cloud's filters are kept in the bank by the filter sync."""

    def __init__(self, config: EdgeConfig, sink: Sink | None = None):
        self.config = config
        self.base = BaseDNN(config.input_size, config.base_model, config.threads)
        self.bank = MCBank(self.base.taps, self.base.input_size)
        local = load_filters(self.bank, config.filters)
        cameras = [cam.name for cam in config.cameras]
        self.uplink: Uplink | None = None
        self.filtersync: FilterSync | None = None
        if sink is None and config.cloud is not None:
            self.uplink = Uplink(config.edge_id, cameras, config.cloud, config.spool)
            named = {spec.name: (spec, onnx) for spec, onnx in local}
            self.filtersync = FilterSync(self.bank, self.uplink, config.cloud, cameras, named)
        self.sink = sink or self.uplink or FolderSink(config.sink.path)
        self._stop = threading.Event()
        self._sources = {
            cam.name: open_source(cam.source, pacing=cam.pacing, fps=cam.fps, name=cam.name) for cam in config.cameras
        }
        self.pipelines = {
            cam.name: CameraPipeline(cam.name, self.base, self.bank, self.sink, self._sources[cam.name].fps)
            for cam in config.cameras
        }

    def run(self) -> None:
        self._connect()
        threads = [
            threading.Thread(target=self._run_camera, args=(cam,), name=f"camera-{cam.name}", daemon=True)
            for cam in self.config.cameras
        ]
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads):
            if self._stop.wait(self.config.stats_interval):
                break
            self.log_stats()
        for thread in threads:
            thread.join()
        self.log_stats(final=True)
        self._close()

    def _connect(self) -> None:
        """Start the uplink and the filter sync; wait (up to the link's timeout) for the cloud's filters."""
        if self.uplink is None or self.filtersync is None:
            return
        self.uplink.start()
        self.filtersync.start()
        timeout = self.config.cloud.timeout
        if not self.filtersync.synced.wait(timeout):
            log.warning(
                "no filters from the cloud within %g s: starting with the local ones; the cloud's follow", timeout
            )

    def _close(self) -> None:
        if self.filtersync is not None:
            self.filtersync.close()
        if self.uplink is not None and self.uplink.connected:
            timeout = self.config.cloud.timeout
            if not self.uplink.wait_drained(timeout):
                log.warning(
                    "%d message(s) not acknowledged within %g s stay spooled for the next start",
                    self.uplink.spool.messages,
                    timeout,
                )
        self.bank.close()
        self.sink.close()

    def _run_camera(self, camera: CameraConfig) -> None:
        source, pipeline = self._sources[camera.name], self.pipelines[camera.name]
        try:
            for frame in source:
                pipeline.process(frame)
                if self._stop.is_set():
                    break
        except Exception:
            log.exception("camera %s: pipeline failed", camera.name)
        finally:
            pipeline.close()
            source.close()

    def log_stats(self, final: bool = False) -> None:
        """Log a stats line per camera and, with a cloud link, send them up (`final`: every camera offline)."""
        cameras: dict[str, dict] = {}
        for name, pipeline in self.pipelines.items():
            source = self._sources[name]
            s = pipeline.take_stats().summary(dropped=source.stats.frames_dropped)
            cameras[name] = {**s, "online": source.stats.online and not final}
            log.info(
                "camera %s: %.1f fps, base %.1f ms, MCs %.1f ms, %d matched, %d bytes, %d dropped so far%s",
                name,
                s["fps"],
                s["base_ms"],
                s["mc_ms"],
                s["matched"],
                s["bytes_out"],
                s["dropped"],
                " (ended)" if source.ended else "" if source.stats.online else " (offline)",
            )
        if self.uplink is not None and self.filtersync is not None:
            sync = {"filters_version": self.filtersync.version, "filter_errors": self.filtersync.errors}
            self.uplink.send_stats(cameras, sync)

    def stop(self) -> None:
        self._stop.set()
        for source in self._sources.values():
            source.close()
