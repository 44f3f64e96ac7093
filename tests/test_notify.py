"""Notifier against the real local Mosquitto (127.0.0.1:1883) and a real HTTP server for webhooks."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pydantic import ValidationError
from support import BROKER, MqttSubscriber, notification, wait_until

from cloud.config import CloudConfig
from cloud.notify import Notifier, payload, topic_level

TIMEOUT = 20.0  # generous: only there so a broken test fails instead of hanging
PUBLIC_URL = "http://cloud:8000"


def make_config(
    mqtt_port: int | None = None, prefix: str = "filterforward", webhooks: Sequence[str] = ()
) -> CloudConfig:
    return CloudConfig(
        tokens=[{"name": "test", "token": "t" * 16}],
        zmq={"insecure": True},
        mqtt={"host": BROKER[0], "port": mqtt_port, "topic_prefix": prefix} if mqtt_port else None,
        webhooks=list(webhooks),
    )


def body(phase: str, event_id: int = 7) -> dict:
    """The JSON every channel sends for support.notification(phase, event_id)."""
    end = phase == "end"
    return {
        "id": event_id,
        "uid": f"edge-1/run-1/{event_id}",
        "edge": "edge-1",
        "camera": "front door/1",
        "filter": "red+car#2",
        "start_frame": 10,
        "end_frame": 42 if end else None,
        "start_time": 0.4,
        "end_time": 1.68 if end else None,
        "peak_score": 0.93,
        "started_at": "2024-05-01T12:00:00+00:00",
        "ended_at": "2024-05-01T12:00:02+00:00" if end else None,
        "url": f"{PUBLIC_URL}/api/events/{event_id}",
        "frame_url": f"{PUBLIC_URL}/api/frames/3.jpg",
        "phase": phase,
    }


def test_the_message_links_the_event_its_frame_or_else_its_clip() -> None:
    assert payload(notification("end"), PUBLIC_URL) == body("end")
    assert payload(notification("end", thumbnail=0), PUBLIC_URL)["frame_url"] == f"{PUBLIC_URL}/api/events/7/clip.mp4"


@pytest.fixture
def prefix() -> str:
    return f"ff-test/{uuid.uuid4().hex}"


@pytest.fixture
def subscriber(prefix: str) -> Iterator[MqttSubscriber]:
    sub = MqttSubscriber(prefix)
    yield sub
    sub.close()


@dataclass
class WebhookServer:
    """A real HTTP server; each path answers its scripted statuses in turn (the last one repeats), default 200."""

    url: str
    scripts: dict[str, list[int]] = field(default_factory=dict)
    received: list[tuple[str, str, dict]] = field(default_factory=list)  # path, content type, JSON body
    gate: threading.Event = field(default_factory=threading.Event)  # requests wait on it; set by default
    got_request: threading.Event = field(default_factory=threading.Event)

    def answer(self, path: str, body: bytes, content_type: str) -> int:
        self.received.append((path, content_type, json.loads(body)))
        self.got_request.set()
        self.gate.wait(TIMEOUT)
        script = self.scripts.get(path, [200])
        return script.pop(0) if len(script) > 1 else script[0]

    def bodies(self, path: str) -> list[dict]:
        return [body for got, _, body in self.received if got == path]


@pytest.fixture
def webhooks() -> Iterator[WebhookServer]:
    holder: list[WebhookServer] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(holder[0].answer(self.path, body, self.headers["Content-Type"]))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    holder.append(WebhookServer(url=f"http://127.0.0.1:{server.server_address[1]}"))
    holder[0].gate.set()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield holder[0]
    holder[0].gate.set()
    server.shutdown()
    server.server_close()


class BrokerProxy:
    """A TCP relay to the local Mosquitto whose port refuses connections until start(): a broker down, then back."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []

    def start(self) -> None:
        self.listener.listen()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(BROKER)
            self.sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()

    def close(self) -> None:
        for sock in [self.listener, *self.sockets]:
            with contextlib.suppress(OSError):  # not connected / never listened
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the other side closed


def test_topic_levels_are_sanitised() -> None:
    assert topic_level("front door/1") == "front door_1"
    assert topic_level("a+b#c") == "a_b_c"
    assert topic_level("") == "_"


def test_prefix_with_a_wildcard_is_refused() -> None:
    with pytest.raises(ValidationError, match="topic_prefix"):
        make_config(mqtt_port=BROKER[1], prefix="home/#")


def test_start_and_end_reach_mqtt_in_order(prefix: str, subscriber: MqttSubscriber) -> None:
    notifier = Notifier(make_config(mqtt_port=BROKER[1], prefix=prefix), PUBLIC_URL)
    start, end = notification("start"), notification("end")
    notifier.publish(start)
    notifier.publish(end)
    (start_topic, start_body), (end_topic, end_body) = subscriber.take(2)
    notifier.close()

    assert start_topic == f"{prefix}/front door_1/red_car_2/start"
    assert end_topic == f"{prefix}/front door_1/red_car_2/end"
    assert (start_body, end_body) == (body("start"), body("end"))
    assert notifier.counts == {**notifier.counts, "mqtt_published": 2, "mqtt_failed": 0, "dropped": 0}


def test_notifications_wait_for_a_broker_that_is_down(prefix: str, subscriber: MqttSubscriber) -> None:
    proxy = BrokerProxy()
    try:
        notifier = Notifier(make_config(mqtt_port=proxy.port, prefix=prefix), PUBLIC_URL)
        for event_id in (1, 2, 3):
            notifier.publish(notification("start", event_id))
        proxy.start()  # the broker is back
        received = subscriber.take(3)
        notifier.close()
    finally:
        proxy.close()
    assert [body["id"] for _, body in received] == [1, 2, 3]
    assert notifier.counts["mqtt_published"] == 3


def test_unreachable_broker_blocks_neither_publish_nor_close(caplog: pytest.LogCaptureFixture) -> None:
    proxy = BrokerProxy()  # never started: every connection is refused
    try:
        with caplog.at_level(logging.DEBUG, logger="cloud.notify"):
            notifier = Notifier(make_config(mqtt_port=proxy.port), PUBLIC_URL, close_wait=0.5)
            for event_id in range(5):
                notifier.publish(notification("start", event_id))
            time.sleep(2.5)  # reconnect attempts (a second apart at first)
            notifier.close()
    finally:
        proxy.close()
    wait_until(lambda: notifier.counts["mqtt_failed"] == 5)
    assert notifier.counts["mqtt_published"] == 0
    # One line that says what is wrong; paho's own ("Client is not connected. Socket: None ...") at every retry
    # came through this logger at ERROR.
    unreachable = [record for record in caplog.records if "unreachable" in record.getMessage()]
    assert len(unreachable) == 1 and not [record for record in caplog.records if record.levelno >= logging.ERROR]


def test_every_webhook_gets_the_json(webhooks: WebhookServer) -> None:
    notifier = Notifier(make_config(webhooks=[f"{webhooks.url}/a", f"{webhooks.url}/b?key=1"]), PUBLIC_URL)
    start, end = notification("start"), notification("end")
    notifier.publish(start)
    notifier.publish(end)
    notifier.close()

    expected = [body("start"), body("end")]
    assert webhooks.bodies("/a") == expected
    assert webhooks.bodies("/b?key=1") == expected
    assert {content_type for _, content_type, _ in webhooks.received} == {"application/json"}
    assert notifier.counts["webhook_sent"] == 4
    assert notifier.counts["webhook_failed"] == 0


def test_a_failing_webhook_is_retried(webhooks: WebhookServer) -> None:
    webhooks.scripts["/flaky"] = [500, 503, 200]
    notifier = Notifier(make_config(webhooks=[f"{webhooks.url}/flaky"]), PUBLIC_URL)
    notifier.publish(notification("start"))
    notifier.close()
    assert len(webhooks.bodies("/flaky")) == 3
    assert notifier.counts["webhook_sent"] == 1
    assert notifier.counts["webhook_failed"] == 0


def test_a_dead_webhook_is_counted_and_does_not_stop_the_others(
    webhooks: WebhookServer, caplog: pytest.LogCaptureFixture
) -> None:
    webhooks.scripts["/dead?token=secret"] = [500]
    notifier = Notifier(make_config(webhooks=[f"{webhooks.url}/dead?token=secret", f"{webhooks.url}/ok"]), PUBLIC_URL)
    notifier.publish(notification("start"))
    notifier.close()
    assert len(webhooks.bodies("/dead?token=secret")) == 3
    assert f"webhook {webhooks.url}/dead failed 3 times for event edge-1/run-1/7 start" in caplog.text
    assert "secret" not in caplog.text  # the query string may hold a token: not logged
    assert len(webhooks.bodies("/ok")) == 1
    assert notifier.counts["webhook_sent"] == 1
    assert notifier.counts["webhook_failed"] == 1


def test_a_full_queue_drops_the_oldest(webhooks: WebhookServer) -> None:
    webhooks.gate.clear()  # the webhook hangs until released
    notifier = Notifier(make_config(webhooks=[f"{webhooks.url}/slow"]), PUBLIC_URL, queue_size=2)
    notifier.publish(notification("start", 1))
    assert webhooks.got_request.wait(TIMEOUT)  # event 1 is being sent, the queue is empty
    for event_id in (2, 3, 4):
        notifier.publish(notification("start", event_id))  # 2 is dropped for 4
    webhooks.gate.set()
    notifier.close()
    assert [body["id"] for body in webhooks.bodies("/slow")] == [1, 3, 4]
    assert notifier.counts["dropped"] == 1
    assert notifier.counts["webhook_sent"] == 3


def test_a_stuck_webhook_does_not_delay_mqtt(webhooks: WebhookServer, prefix: str, subscriber: MqttSubscriber) -> None:
    webhooks.gate.clear()
    notifier = Notifier(make_config(mqtt_port=BROKER[1], prefix=prefix, webhooks=[f"{webhooks.url}/slow"]), PUBLIC_URL)
    for event_id in (1, 2, 3):
        notifier.publish(notification("start", event_id))
    assert [body["id"] for _, body in subscriber.take(3)] == [1, 2, 3]  # while the webhook still hangs
    webhooks.gate.set()
    notifier.close()
    assert [body["id"] for body in webhooks.bodies("/slow")] == [1, 2, 3]
    assert notifier.counts["mqtt_published"] == 3
