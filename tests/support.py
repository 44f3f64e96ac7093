"""Small helpers the tests share: a free loopback port, polling with a bound, a subscriber on the local
Mosquitto broker, an event notification, frames read from a real clip, and the web page signed in."""

from __future__ import annotations

import itertools
import json
import os
import queue
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from cloud.storage import EventRecord, Notification

BROKER = ("127.0.0.1", 1883)
MQTT_WAIT = 20.0  # seconds; only keeps a broken test from hanging
PORT_BLOCK = 2000  # ports per test process: each xdist worker (gw0, gw1, ...) has its own, from FIRST_PORT up
FIRST_PORT = 20000
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
_PORTS = itertools.cycle(range(FIRST_PORT + _WORKER % 6 * PORT_BLOCK, FIRST_PORT + (_WORKER % 6 + 1) * PORT_BLOCK))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, from this test process's own block below the kernel's ephemeral range
    (32768-60999 by default). A port bound to 0 and let go came from that range, where every outgoing connection
    takes its source port: a client's connection or the other xdist worker's server took one before the server
    meant to have it bound it ("Address already in use", once in a CI run)."""
    for _ in range(PORT_BLOCK):
        port = next(_PORTS)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use, or lingering after a server that just stopped
            return port
    raise RuntimeError(f"no free port among {PORT_BLOCK} of this test process's block")


def wait_until(condition: Callable[[], bool], what: str = "the condition", timeout: float = 30.0) -> None:
    """Poll `condition` until it holds; the timeout only keeps a broken test from hanging, it is no assertion
    on speed."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.01)


class MqttSubscriber:
    """A real paho client subscribed to <prefix>/# on the local broker; messages are kept with their arrival time."""

    def __init__(self, prefix: str) -> None:
        self.messages: queue.Queue[tuple[str, dict, float]] = queue.Queue()
        subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2)
        self.client.on_message = lambda client, userdata, message: self.messages.put(
            (message.topic, json.loads(message.payload), time.time())
        )
        self.client.on_subscribe = lambda *args: subscribed.set()
        self.client.on_connect = lambda client, *args: client.subscribe(f"{prefix}/#", qos=1)
        self.client.connect(*BROKER)
        self.client.loop_start()
        assert subscribed.wait(MQTT_WAIT), "could not subscribe at the local Mosquitto"

    def take_timed(self, n: int) -> list[tuple[str, dict, float]]:
        """The next n messages as (topic, JSON payload, arrival unix time)."""
        return [self.messages.get(timeout=MQTT_WAIT) for _ in range(n)]

    def take(self, n: int) -> list[tuple[str, dict]]:
        return [(topic, body) for topic, body, _ in self.take_timed(n)]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def clip_frames(clip: Path, first: int, count: int, size: tuple[int, int]) -> list[np.ndarray]:
    """`count` BGR frames of a video from frame `first` on, resized to `size` (width, height)."""
    capture = cv2.VideoCapture(str(clip))
    capture.set(cv2.CAP_PROP_POS_FRAMES, first)
    out = []
    while len(out) < count:
        ok, frame = capture.read()
        assert ok, f"{clip} ended before frame {first + count}"
        out.append(cv2.resize(frame, size, interpolation=cv2.INTER_AREA))
    capture.release()
    return out


def with_encoding(bundle: Path, kind: str, out: Path) -> Path:
    """A copy of a filter bundle whose spec sends its matches with another encoding (stream, jpeg, clip)."""
    shutil.copytree(bundle, out)
    spec = json.loads((out / "spec.json").read_text())
    (out / "spec.json").write_text(json.dumps({**spec, "encoding": {**spec.get("encoding", {}), "kind": kind}}))
    return out


def notification(
    phase: str, event_id: int = 7, camera: str = "front door/1", filter_name: str = "red+car#2", thumbnail: int = 3
) -> Notification:
    """An event start or end as the storage hands it over: edge-1's event, shown by frame `thumbnail` (or
    0 for none)."""
    end = phase == "end"
    event = EventRecord(
        id=event_id,
        uid=f"edge-1/run-1/{event_id}",
        edge="edge-1",
        camera=camera,
        filter=filter_name,
        start_frame=10,
        end_frame=42 if end else None,
        start_time=0.4,
        end_time=1.68 if end else None,
        peak_score=0.93,
        started_at=datetime(2024, 5, 1, 12, 0, tzinfo=UTC),
        ended_at=datetime(2024, 5, 1, 12, 0, 2, tzinfo=UTC) if end else None,
        thumbnail=thumbnail or None,
    )
    return Notification(phase=phase, event=event)


@contextmanager
def signed_in(browser: Any, url: str, token: str, **context_options: Any) -> Iterator[Any]:
    """The cloud's web page in a fresh Playwright browser context, signed in with `token`; an uncaught exception in
    the page's scripts fails the test."""
    context = browser.new_context(**context_options)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(url + "/")
    page.get_by_label("Bearer token").fill(token)
    page.get_by_test_id("token-save").click()
    try:
        yield page
    finally:
        context.close()
    assert errors == [], errors


def wait_shown(page: Any, frame: int, timeout: float = 30_000) -> None:
    """Until the studio page shows `frame` as the current one, its image loaded (`timeout` in ms)."""
    page.wait_for_function(
        """frame => {
            const img = document.getElementById('frame-image');
            return document.getElementById('stage').dataset.frame === String(frame)
                && img.dataset.frame === String(frame) && img.complete && img.naturalWidth > 0;
        }""",
        arg=frame,
        timeout=timeout,
    )


def beat_from_two_processes(ingest_port: int, edge: str, beats: int = 4) -> None:
    """Heartbeats as `edge` from two live connections in turn, as two boxes started from one copied config send."""
    import zmq

    from common.protocol import Heartbeat, encode

    context = zmq.Context()
    try:
        dealers = [context.socket(zmq.DEALER) for _ in range(2)]
        for dealer in dealers:
            dealer.connect(f"tcp://127.0.0.1:{ingest_port}")
        for _ in range(beats):
            for dealer in dealers:
                dealer.send_multipart(encode(Heartbeat(sender=edge)))
                assert dealer.poll(30_000), "the ingest did not answer"
                dealer.recv_multipart()
    finally:
        context.destroy(linger=0)
