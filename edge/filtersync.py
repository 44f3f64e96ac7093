"""Keeps the edge's MC bank in step with the cloud's filter registry (the ZeroMQ guide's Clone pattern).

A SUB socket receives every filter change the cloud publishes, each one version above the last. Once that
socket is connected (so no change published from now on is missed), a snapshot is requested over the
link (edge.link): one FilterUpdate per current filter, then SnapshotEnd with the version it reflects. The
snapshot replaces the cloud-managed filters in the bank; changes published meanwhile are held and applied
after it, in order, when above its version. A gap in the versions, a reconnect of the SUB socket or a new
cloud session (the cloud restarted) means something may have been missed: a new snapshot is requested.

Filters from local bundles in the edge config stay unless the cloud has one of the same name (and come
back when the cloud deletes it). Filters that apply to none of this edge's cameras are kept out of the
bank. A filter that fails to load here (say, trained at another input size) is logged, counted in
`errors` and skipped; the rest of the change set still applies.

The cloud's filters that run here are kept on disk (edge.filtercache) after every change and go into the bank on
start, before the cloud answers: an edge restarted during an outage filters with them as it last had them (and
spools its matches), where it would match nothing; the first snapshot then replaces them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

import zmq

from common.protocol import TOPIC, FilterUpdate, ProtocolError, SnapshotEnd, SnapshotRequest, decode
from edge.filtercache import FilterCache
from edge.link import CloudSocket, Link, Worker
from edge.mcbank import MCBank
from models.filterspec import FilterSpec

log = logging.getLogger(__name__)

Update = tuple[FilterUpdate, bytes]
_RESNAPSHOT = "resnapshot"  # queued when the link reports a new cloud session
KEPT = 0  # the "version" of a filter restored from disk: below every real one, so any snapshot puts it again


class FilterSync:
    """Applies the cloud's filters to `bank`; `version` is the filter-set version the bank reflects."""

    def __init__(
        self,
        bank: MCBank,
        link: Link,
        cameras: list[str],
        local: dict[str, tuple[FilterSpec, bytes]] | None = None,
        cache: FilterCache | None = None,
    ):
        self.bank = bank
        self.link = link
        self.cameras = list(cameras)
        self.local = dict(local or {})  # name -> (spec, onnx) from the edge config's bundles
        self.cache = cache
        self.version = 0
        self.errors = 0
        self.restored = 0  # filters put in the bank from the cache on start
        self.synced = threading.Event()  # set once the first snapshot is applied
        self._cloud: dict[str, int] = {}  # names the cloud governs -> version of the change last applied
        self._running: dict[str, tuple[FilterSpec, bytes]] = {}  # the cloud's filters in the bank: what is kept
        self._from_link: queue.SimpleQueue[tuple[FilterUpdate | SnapshotEnd, bytes] | str] = queue.SimpleQueue()
        # Parts of the snapshot being received: replies come whole and in order, so the parts since the last
        # SnapshotEnd belong to the next one.
        self._snapshot: dict[str, Update] = {}
        self._awaiting_since: float | None = None  # when the outstanding snapshot was requested
        self._held: list[Update] = []  # published changes that arrived while awaiting a snapshot
        self._announced: tuple[int, list[str]] | None = None  # the version and filters the last snapshot logged
        self._worker = Worker("filtersync", self._serve)
        link.route(FilterUpdate, self._reply)
        link.route(SnapshotEnd, self._reply)
        link.on_restart(self._session_changed)

    def start(self) -> None:
        """Restore the kept filters, then follow the cloud."""
        if self.cache is not None:
            for spec, onnx in self.cache.load():
                if self._load(spec.name, KEPT, spec, onnx):
                    self.restored += 1
        self._worker.start()

    def close(self) -> None:
        self._worker.stop()

    # -- called from the link's thread --------------------------------------------------------------------

    def _reply(self, header: FilterUpdate | SnapshotEnd, payload: bytes) -> None:
        self._from_link.put((header, payload))
        self._worker.wake()

    def _session_changed(self) -> None:
        self._from_link.put(_RESNAPSHOT)
        self._worker.wake()

    # -- the sync thread ---------------------------------------------------------------------------------

    def _serve(self) -> None:
        config = self.link.config
        # The link's DEALER reports a refused key: one line per edge, not one per socket.
        cloud = CloudSocket(zmq.SUB, config, config.publish_port, report=False, subscribe=TOPIC)
        try:
            while not self._worker.stopping.is_set():
                cloud.wait(config.heartbeat, self._worker.reader)
                self._worker.clear()
                if zmq.EVENT_HANDSHAKE_SUCCEEDED in cloud.events():
                    self._request_snapshot("connected")  # the subscription is in place: nothing new is missed
                self._receive_published(cloud.socket)
                self._receive_from_link()
                self._retry_snapshot()
        except Exception:
            log.exception("filter sync with %s failed; the bank keeps its filters", cloud.monitor.endpoint)
        finally:
            cloud.close()

    def _receive_published(self, sub: zmq.Socket) -> None:
        while sub.poll(0):
            frames = sub.recv_multipart()
            try:
                header, payload = decode(frames[1:])
            except ProtocolError as exc:
                log.warning("unreadable filter update from the cloud: %s", exc)
                continue
            if not isinstance(header, FilterUpdate):
                log.warning("unexpected %s message on the filter channel; ignored", header.type)
            elif self._awaiting_since is not None:
                self._held.append((header, payload))
            else:
                self._apply_published(header, payload)

    def _receive_from_link(self) -> None:
        while not self._from_link.empty():
            message = self._from_link.get()
            if message == _RESNAPSHOT:
                self._snapshot = {}  # parts of a reply the old cloud process did not finish
                self._request_snapshot("the cloud restarted")
                continue
            header, payload = message
            if isinstance(header, FilterUpdate):
                self._snapshot[header.name] = (header, payload)
            else:
                self._end_snapshot(header.version)

    def _retry_snapshot(self) -> None:
        timeout = self.link.config.timeout
        if self._awaiting_since is not None and time.monotonic() - self._awaiting_since > timeout:
            self._request_snapshot(f"no snapshot within {timeout:g} s")

    def _request_snapshot(self, why: str) -> None:
        log.debug("requesting a filter snapshot: %s", why)
        self._awaiting_since = time.monotonic()
        self.link.post(SnapshotRequest(edge=self.link.edge_id))

    def _end_snapshot(self, version: int) -> None:
        snapshot, self._snapshot = self._snapshot, {}
        if self._awaiting_since is None and version <= self.version:
            return  # the answer to an extra request, no newer than what the bank has
        self._awaiting_since = None
        for name in [name for name in self._cloud if name not in snapshot]:
            self._drop(name)
        for header, payload in snapshot.values():
            self._put(header, payload)
        self._set_version(version)
        # A cloud restart can be noticed twice (its new session, the reconnect): a snapshot that changed nothing
        # since the last one said so goes to the debug level.
        state = (version, sorted(self.bank.filters))
        level = logging.INFO if state != self._announced else logging.DEBUG
        self._announced = state
        log.log(level, "filters in step with the cloud at version %d: %s", version, state[1] or "none")
        self._keep()
        held, self._held = self._held, []
        for header, payload in sorted(held, key=lambda update: update[0].version):
            if self._awaiting_since is None:  # a gap among them asks for another snapshot
                self._apply_published(header, payload)
        self.synced.set()

    def _apply_published(self, header: FilterUpdate, payload: bytes) -> None:
        if header.version <= self.version:
            return  # already reflected by the snapshot
        if header.version > self.version + 1:
            log.warning("filter updates jumped from version %d to %d", self.version, header.version)
            self._request_snapshot("gap in the versions")
            return
        if header.action == "put":
            self._put(header, payload)
        elif header.name in self._cloud:
            self._drop(header.name)
        self._set_version(header.version)
        self._keep()

    def _set_version(self, version: int) -> None:
        self.version = version
        self.link.filters_version = version

    def _keep(self) -> None:
        if self.cache is not None:
            self.cache.save(self.version, self._running.values())

    # -- changes to the bank -----------------------------------------------------------------------------

    def _put(self, header: FilterUpdate, payload: bytes) -> None:
        if self._cloud.get(header.name) == header.version:
            return  # unchanged since we applied it
        if header.spec is None:
            self._cloud[header.name] = header.version
            self._failed(header.name, header.version, "the update carries no spec")
        else:
            self._load(header.name, header.version, header.spec, payload)

    def _load(self, name: str, version: int, spec: FilterSpec, onnx: bytes) -> bool:
        """The cloud's filter into the bank if it runs here (whether it does); it governs `name` either way. A
        filter that fails to load leaves the bank, and so what is kept, as it was."""
        self._cloud[name] = version
        if not any(spec.applies_to(camera) for camera in self.cameras):
            self.bank.remove(name)
            self._running.pop(name, None)
            log.info("filter %s is for cameras %s, none of them here; not loaded", name, spec.cameras)
            return False
        try:
            self.bank.put(spec, onnx)
        except Exception as exc:  # a model the cloud accepted can still fail here; ONNX Runtime raises many types
            self._failed(name, version, str(exc))
            return False
        self._running[name] = (spec, onnx)
        return True

    def _drop(self, name: str) -> None:
        """The cloud no longer has `name`: the local bundle of that name comes back, or the filter goes."""
        del self._cloud[name]
        self._running.pop(name, None)
        if name in self.local:
            self.bank.put(*self.local[name])
            log.info("filter %s deleted in the cloud: the local bundle of that name is active again", name)
        else:
            self.bank.remove(name)

    def _failed(self, name: str, version: int, why: str) -> None:
        self.errors += 1
        kept = "kept from the cloud" if version == KEPT else f"(version {version}) from the cloud"
        log.error("filter %s %s cannot run on this edge: %s; skipped", name, kept, why)
