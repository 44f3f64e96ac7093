"""An edge node: one base DNN and one MC bank shared by all configured cameras, each in its own thread.

Stopping (`stop()`, from SIGTERM or Ctrl-C): the cameras stop reading, their pipelines close the open events
(the end messages go to the spool like any other), the uplink gets up to min(DRAIN_MAX, cloud.timeout)
seconds to have the spool acknowledged while the cloud answers, then the filter sync, the link (sending the
last stats) and the spool close. A `stop()` during that wait (the second signal) cuts it short. What stays
spooled goes first on the next start.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.protocol import Stats
from edge.config import CameraConfig, EdgeConfig
from edge.filtercache import FilterCache
from edge.filtersync import FilterSync
from edge.footage import FootageRecorder
from edge.link import Link
from edge.mcbank import MCBank
from edge.metrics import EdgeCollector, MetricsServer
from edge.pipeline import CameraPipeline, StageStats
from edge.sink import FolderSink, Sink
from edge.sources import Frame, VideoSource, open_source
from edge.uplink import Uplink
from models.basednn import BaseDNN
from models.bundle import load_bundles
from models.errors import FilterForwardError
from models.filterspec import FilterSpec
from models.memory import check_edge_memory

log = logging.getLogger(__name__)
FAILURE_LOG_EVERY = 100  # while frames keep failing, one log line per this many
OFFLINE_POLL = 0.5  # seconds a camera thread waits for a frame before it checks whether its camera is offline

DRAIN_MAX = 10.0  # seconds a stopping node waits at most for the cloud to acknowledge the spool
POLL = 0.1  # seconds between checks for a stop request (a signal handler only bumps a counter)
FILTERS_FOLDER = "filters"  # under the spool's folder: the cloud's filters as this edge last had them


def load_filters(bank: MCBank, bundles: list[Path], cameras: list[str]) -> list[tuple[FilterSpec, bytes]]:
    filters = load_bundles(bundles)
    bank.put_many(filters)
    for spec, _ in filters:
        if not any(spec.applies_to(camera) for camera in cameras):
            log.warning(
                "filter %s is for cameras %s, none of which this edge has (%s): it runs nowhere: in its spec.json, set "
                "cameras to this edge's camera names or '*'",
                spec.name,
                ", ".join(spec.cameras),
                ", ".join(cameras),
            )
    return filters


@dataclass
class _Totals:
    """A camera's counts since the node started (the pipeline's own start afresh every stats window)."""

    frames: int = 0
    matched: int = 0
    bytes_out: int = 0
    skipped: int = 0
    failed: int = 0  # frames the pipeline could not process (say, the sink's disk was full); counted as they fail

    def add(self, stats: StageStats) -> None:
        self.frames += stats.frames
        self.matched += stats.matched
        self.bytes_out += stats.bytes_out
        self.skipped += stats.skipped


class EdgeNode:
    """Runs every camera until its source ends or `stop()` is called; logs per-camera stats periodically.

    With a `cloud` link configured (and no sink given), one link to the cloud carries the uplink (matched
    frames), the filter sync (the cloud's filters, kept in the bank), the stats and the footage the cloud asks
    for (recorded under <spool>/footage, sent behind the matched frames). With `metrics_port` set,
    /metrics serves the cameras' and the uplink's numbers while `run()` runs."""

    def __init__(self, config: EdgeConfig, sink: Sink | None = None):
        self.config = config
        check_edge_memory(config.input_size, len(config.cameras))
        self.base = BaseDNN(config.input_size, config.base_model, config.threads)
        self.bank = MCBank(
            self.base.taps, self.base.input_size, base_model=self.base.identity, weights=config.mc_weights
        )
        cameras = [cam.name for cam in config.cameras]
        local = load_filters(self.bank, config.filters, cameras)
        if not local and (sink is not None or config.cloud is None):
            log.warning("no filters: nothing will be matched; list filter bundles under filters:, or add a cloud:")
        self.link: Link | None = None
        self.uplink: Uplink | None = None
        self.filtersync: FilterSync | None = None
        self.footage: FootageRecorder | None = None
        if sink is None and config.cloud is not None:
            self.link = Link(config.edge_id, cameras, config.cloud, self.base.identity, self.base.input_size)
            self.uplink = Uplink(self.link, config.spool)
            self.footage = FootageRecorder(self.link, self.uplink, config.spool.path / "footage")
            named = {spec.name: (spec, onnx) for spec, onnx in local}
            kept = FilterCache(config.spool.path / FILTERS_FOLDER)
            self.filtersync = FilterSync(self.bank, self.link, cameras, named, kept)
        self.sink = sink or self.uplink or FolderSink(config.sink.path)
        self.metrics: MetricsServer | None = None
        self._stop = threading.Event()  # set by run() once a stop was asked for: the camera threads see it
        self._stop_requests = 0  # stop() only increments this: safe in a signal handler
        self.sources = {cam.name: _open_camera(cam) for cam in config.cameras}
        self.pipelines = {
            cam.name: CameraPipeline(
                cam.name, self.base, self.bank, self.sink, self.sources[cam.name].fps, cam.upload, cam.change_gate
            )
            for cam in config.cameras
        }
        self._stats_lock = threading.Lock()  # the window swap against /metrics reading the totals
        self._totals = {name: _Totals() for name in cameras}
        self._errors: dict[str, list[str]] = {name: [] for name in cameras}  # per camera: what went wrong
        self._window: dict[str, dict[str, Any]] = {}  # each camera's last stats window
        self._ended_logged: set[str] = set()  # cameras whose source ended and whose last line was logged

    def run(self) -> None:
        """Until every source ends or `stop()`; then close the open events, drain the uplink and close."""
        self._start_metrics()
        try:
            self._connect()
            threads = [
                threading.Thread(target=self._run_camera, args=(cam,), name=f"camera-{cam.name}", daemon=True)
                for cam in self.config.cameras
            ]
            for thread in threads:
                thread.start()
            self._supervise(threads)
            self._stop.set()
            # A camera blocked on its next frame gets None once its source closes: its loop ends and its events
            # close. In parallel: a live source's reader may take seconds to give up a stalled connection.
            closers = [threading.Thread(target=source.close) for source in self.sources.values()]
            for thread in closers:
                thread.start()
            for thread in closers + threads:
                thread.join()
            self.log_stats(final=True)
            self._close()
        finally:
            if self.metrics is not None:
                self.metrics.close()

    def problems(self) -> list[str]:
        """What went wrong in the run, one line per camera: failed frames and sources that ended early."""
        lines = []
        for name, totals in self._totals.items():
            if totals.failed:
                lines.append(f"camera {name}: {totals.failed} frame(s) failed (see the errors logged above)")
            lines += [f"camera {name}: {error}" for error in self._errors[name]]
        return lines

    def stop(self) -> None:
        """Ask the node to stop (see the module doc); a call while the uplink drains cuts that short.

        Only increments a counter (no locks), so it is safe from a signal handler and from any thread."""
        self._stop_requests += 1

    def _stopping(self) -> bool:
        return self._stop_requests > 0

    def _supervise(self, threads: list[threading.Thread]) -> None:
        """Log stats every stats_interval until the cameras have all ended or a stop is requested."""
        next_stats = time.monotonic() + self.config.stats_interval
        while any(thread.is_alive() for thread in threads):
            if self._stopping():
                log.info("stopping: closing the cameras' open events")
                return
            if time.monotonic() >= next_stats:
                self.log_stats()
                next_stats = time.monotonic() + self.config.stats_interval
            time.sleep(max(0.0, min(POLL, next_stats - time.monotonic())))

    def _connect(self) -> None:
        """Start the link and the filter sync; wait (up to the link's timeout) for the cloud's filters."""
        if self.link is None or self.filtersync is None:
            return
        self.link.start()
        self.filtersync.start()
        timeout = self.config.cloud.timeout
        deadline = time.monotonic() + timeout
        while not self.filtersync.synced.wait(POLL):
            if self._stopping():
                return
            if time.monotonic() >= deadline:
                running = len(self.bank.filters)
                log.warning(
                    "no filters from the cloud within %g s: starting with %d filter(s), %d of them the cloud's as this "
                    "edge last had them; the cloud's follow when it answers%s",
                    timeout,
                    running,
                    self.filtersync.restored,
                    "" if running else " (until then nothing will be matched)",
                )
                return

    def _close(self) -> None:
        if self.filtersync is not None:
            self.filtersync.close()
        if self.link is not None and self.uplink is not None:
            self._drain(self.link, self.uplink)
            self.link.close()
        self.bank.close()
        self.sink.close()

    def _drain(self, link: Link, uplink: Uplink) -> None:
        """Wait for the cloud to acknowledge the spool and the footage recorded: up to min(DRAIN_MAX, cloud.timeout)
        s while it answers, until a stop request comes meanwhile. The rest stays spooled (or recorded) and goes
        first on the next start."""
        limit = min(DRAIN_MAX, self.config.cloud.timeout)
        deadline, requests = time.monotonic() + limit, self._stop_requests
        if self._undelivered(uplink) and link.connected:
            log.info(
                "waiting up to %g s for the cloud to acknowledge %d spooled message(s) and %d of footage",
                limit,
                uplink.spool.messages,
                self.footage.waiting() if self.footage is not None else 0,
            )
        while self._undelivered(uplink) and link.connected and time.monotonic() < deadline:
            if self._stop_requests > requests:
                log.warning("stopping at once (asked again): not waiting for the cloud's acknowledgements")
                break
            if uplink.spool.messages:
                uplink.wait_drained(POLL)
            else:
                time.sleep(POLL / 10)  # only footage is left: the link's thread spools it next
        if uplink.spool.messages:
            log.warning(
                "%d message(s) the cloud has not acknowledged stay spooled in %s for the next start",
                uplink.spool.messages,
                uplink.spool.path,
            )
        footage = self.footage
        if footage is not None and footage.waiting():
            log.warning("%d footage message(s) stay in %s for the next start", footage.waiting(), footage.folder)

    def _undelivered(self, uplink: Uplink) -> int:
        """Messages the cloud has not acknowledged yet: spooled, or footage still to spool."""
        return uplink.spool.messages + (self.footage.waiting() if self.footage is not None else 0)

    def _run_camera(self, camera: CameraConfig) -> None:
        source, pipeline = self.sources[camera.name], self.pipelines[camera.name]
        failures = 0
        try:
            while not self._stop.is_set():
                frame = source.read(timeout=OFFLINE_POLL)
                if frame is not None:
                    pipeline.fps = source.fps or pipeline.fps  # a live camera's may change once measured (edge.sources)
                    failures = self._process(camera.name, pipeline, frame, failures)
                elif source.ended:
                    break
                elif not source.stats.online:
                    pipeline.end_events()  # an outage ends the camera's open events; no-op once they are
        except FilterForwardError as exc:  # the source failed for a reason it explains (a recording cut short)
            log.error("camera %s: %s", camera.name, exc)
            self._errors[camera.name].append(str(exc))
        except Exception as exc:  # the source itself failed unexpectedly: this camera is done
            log.exception("camera %s: source failed", camera.name)
            self._errors[camera.name].append(f"source failed ({exc})")
        finally:
            if self.footage is not None:
                self.footage.camera_ended(camera.name)
            try:
                pipeline.end_events()
            except Exception as exc:  # say, the sink's disk is full: the events stay open there
                log.exception("camera %s: its open events could not be closed", camera.name)
                self._errors[camera.name].append(f"its open events could not be closed ({exc})")
            source.close()

    def _process(self, camera: str, pipeline: CameraPipeline, frame: Frame, failures: int) -> int:
        """One frame through the pipeline; a frame that fails is logged, counted and skipped, and the camera goes
        on (a node runs unattended: one bad frame or a transient error must not stop a camera for good). Returns
        the number of consecutive failures, which rate-limits the log."""
        try:
            if self.footage is not None:
                self.footage.offer(camera, frame)  # before the change gate: footage is what the camera sees
            pipeline.process(frame)
        except Exception:
            with self._stats_lock:
                self._totals[camera].failed += 1
            failures += 1
            if failures == 1 or failures % FAILURE_LOG_EVERY == 0:
                log.exception("camera %s: frame %d failed (%d in a row); skipped", camera, frame.index, failures)
            return failures
        if failures:
            log.info("camera %s: frames are processed again after %d failed", camera, failures)
        return 0

    def log_stats(self, final: bool = False) -> None:
        """Log a stats line per camera and, with a cloud link, send them up (`final`: every camera offline)."""
        cameras: dict[str, dict] = {}
        for name, pipeline in self.pipelines.items():
            source = self.sources[name]
            stats = source.stats
            with self._stats_lock:
                window = pipeline.take_stats()
                self._totals[name].add(window)
                s = window.summary(dropped=stats.frames_dropped, capped=stats.frames_capped)
                cameras[name] = self._window[name] = {
                    **s,
                    "decode_ms": stats.decode_ms,
                    "online": stats.online and not final,
                }
            if name in self._ended_logged and not final:
                continue  # an ended camera's line was logged once: the same zeros every interval say nothing
            if source.ended:
                self._ended_logged.add(name)
            log.info(
                "camera %s: %.1f fps, decode %.1f ms, base %.1f ms, MCs %.1f ms, %d unchanged, %d matched, %d bytes, "
                "%d dropped, %d failed so far%s%s",
                name,
                s["fps"],
                stats.decode_ms,
                s["base_ms"],
                s["mc_ms"],
                s["skipped"],
                s["matched"],
                s["bytes_out"],
                s["dropped"],
                self._totals[name].failed,
                f" ({s['capped']} left out by the fps cap)" if s["capped"] else "",
                _state(source.ended, stats.online, stopped=final and self._stopping()),
            )
        if self.link is not None and self.uplink is not None and self.filtersync is not None:
            counters = {**self._uplink_stats(), **self._filter_stats()}
            self.link.post(Stats(edge=self.config.edge_id, cameras=cameras, uplink=counters))

    # -- /metrics ----------------------------------------------------------------------------------------------

    def camera_metrics(self) -> dict[str, dict[str, Any]]:
        """Per camera: the last window's rates and times, counts since the start, and whether it is online."""
        metrics = {}
        for name, pipeline in self.pipelines.items():
            stats = self.sources[name].stats
            with self._stats_lock:
                current, totals, window = pipeline.stats, self._totals[name], self._window.get(name, {})
                metrics[name] = {
                    "fps": window.get("fps", 0.0),
                    "base_ms": window.get("base_ms", 0.0),
                    "mc_ms": window.get("mc_ms", 0.0),
                    "decode_ms": stats.decode_ms,
                    "frames": totals.frames + current.frames,
                    "matched": totals.matched + current.matched,
                    "skipped": totals.skipped + current.skipped,
                    "dropped": stats.frames_dropped,
                    "capped": stats.frames_capped,
                    "online": stats.online and not self._stop.is_set(),
                }
        return metrics

    def _uplink_stats(self) -> dict[str, Any]:
        footage = self.footage.stats() if self.footage is not None else {}
        return {**self.uplink.stats(), **footage}

    def _filter_stats(self) -> dict[str, int]:
        return {"filters_version": self.filtersync.version, "filter_errors": self.filtersync.errors}

    def _start_metrics(self) -> None:
        if self.config.metrics_port is None:
            return
        collector = EdgeCollector(
            self.config.edge_id,
            self.camera_metrics,
            self._uplink_stats if self.uplink is not None else None,
            self._filter_stats if self.filtersync is not None else None,
        )
        self.metrics = MetricsServer(self.config.metrics_port, collector)


def _open_camera(cam: CameraConfig) -> VideoSource:
    """The camera's source; its errors name the camera (with several, a path alone did not say which to fix)."""
    try:
        return open_source(
            cam.source,
            pacing=cam.pacing,
            fps=cam.fps,
            resolution=cam.resolution,
            queue_size=cam.buffer_frames,
            name=cam.name,
        )
    except FilterForwardError as exc:
        raise FilterForwardError(f"camera {cam.name}: {exc}") from None


def _state(ended: bool, online: bool, stopped: bool) -> str:
    """The stats line's ending: why a camera delivers no more frames, if it does not."""
    if stopped:
        return " (stopped)"
    return " (ended)" if ended else "" if online else " (offline)"
