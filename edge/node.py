"""An edge node: one base DNN and one MC bank shared by all configured cameras, each in its own thread."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from edge.basednn import BaseDNN
from edge.config import CameraConfig, EdgeConfig
from edge.mcbank import MCBank
from edge.pipeline import CameraPipeline
from edge.sink import FolderSink, Sink
from edge.sources import open_source
from models.bundle import load_bundle

log = logging.getLogger(__name__)


def load_filters(bank: MCBank, bundles: list[Path]) -> None:
    bank.put_many([load_bundle(path) for path in bundles])


class EdgeNode:
    """Runs every camera until its source ends or `stop()` is called; logs per-camera stats periodically."""

    def __init__(self, config: EdgeConfig, sink: Sink | None = None):
        self.config = config
        self.base = BaseDNN(config.input_size, config.base_model, config.threads)
        self.bank = MCBank(self.base.taps, self.base.input_size)
        load_filters(self.bank, config.filters)
        self.sink = sink or FolderSink(config.sink.path)
        self._stop = threading.Event()
        self._sources = {
            cam.name: open_source(cam.source, pacing=cam.pacing, fps=cam.fps, name=cam.name) for cam in config.cameras
        }
        self.pipelines = {
            cam.name: CameraPipeline(cam.name, self.base, self.bank, self.sink, self._sources[cam.name].fps)
            for cam in config.cameras
        }

    def run(self) -> None:
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
        self.log_stats()
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

    def log_stats(self) -> None:
        for name, pipeline in self.pipelines.items():
            source = self._sources[name]
            s = pipeline.take_stats().summary(dropped=source.stats.frames_dropped)
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

    def stop(self) -> None:
        self._stop.set()
        for source in self._sources.values():
            source.close()
