"""Event start/end notifications to MQTT and webhooks, sent from background threads so ingest never waits on them."""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
import urllib.request
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from http.client import HTTPException
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from cloud.config import CloudConfig, MqttConfig

if TYPE_CHECKING:
    from cloud.storage import Notification

log = logging.getLogger(__name__)

COUNT_NAMES = ("mqtt_published", "mqtt_failed", "webhook_sent", "webhook_failed", "dropped")
WEBHOOK_TRIES = 3
WEBHOOK_TIMEOUT = 5.0  # seconds per try
WEBHOOK_BACKOFF = 0.5  # seconds before the 2nd try, doubled before each later one
MQTT_RECONNECT_MAX = 10  # seconds between reconnect attempts at most, so a broker that is back gets the backlog soon
DROP_LOG_EVERY = 100  # a full queue logs its 1st drop and every 100th, not each one

Count = Callable[[str, int], None]
Sender = Callable[["_Message", threading.Event], None]


@dataclass(frozen=True)
class _Message:
    label: str  # names the notification in logs
    topic: str
    body: bytes


def topic_level(name: str) -> str:
    """One MQTT topic level from a camera or filter name: '/', the wildcards '+' '#' and NUL are not allowed in it."""
    cleaned = "".join("_" if char in "/+#\0" else char for char in name)
    return cleaned or "_"


def _display(url: str) -> str:
    """A webhook URL for the log, without the user:password or query string that may hold a secret."""
    parts = urlsplit(url)
    return parts._replace(netloc=parts.netloc.rpartition("@")[2], query="", fragment="").geturl()


class _Outbox:
    """A bounded FIFO drained by its own thread: a slow or dead destination delays only itself."""

    def __init__(self, name: str, send: Sender, size: int, count: Count, failed: str) -> None:
        self.name = name
        self._send = send
        self._size = size
        self._count = count
        self._failed = failed  # the counter for messages close() abandons
        self._items: deque[_Message] = deque()
        self._wake = threading.Condition()
        self._closing = False
        self._dropped = 0
        self.stop = threading.Event()  # set when close gives up waiting: senders stop waiting and retrying
        self._thread = threading.Thread(target=self._run, name=f"notify {name}", daemon=True)
        self._thread.start()

    def put(self, message: _Message) -> None:
        with self._wake:
            if self._closing:
                dropped: _Message | None = message
            else:
                dropped = self._items.popleft() if len(self._items) >= self._size else None
                self._items.append(message)
                self._wake.notify()
            if dropped is not None:
                self._dropped += 1
                total = self._dropped
        if dropped is not None:
            self._count("dropped", 1)
            if total == 1 or total % DROP_LOG_EVERY == 0:
                why = "notifier is closed" if self._closing else f"queue is full ({self._size})"
                log.warning("notification to %s dropped (%s), %d so far: %s", self.name, why, total, dropped.label)

    def finish(self) -> None:
        """Send what is queued, then let the thread end."""
        with self._wake:
            self._closing = True
            self._wake.notify()

    def join(self, deadline: float) -> None:
        """Wait for the queue to drain until `deadline` (monotonic); count what is left as failed."""
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if not self._thread.is_alive():
            return
        self.stop.set()
        with self._wake:
            left = len(self._items)
            self._items.clear()
        if left:
            log.warning("%d notifications to %s not sent before close", left, self.name)
            self._count(self._failed, left)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._items and not self._closing:
                    self._wake.wait()
                if not self._items or self.stop.is_set():
                    return
                message = self._items.popleft()
            try:
                self._send(message, self.stop)
            except Exception:  # a bug in one send must not stop later notifications
                log.exception("sending %s to %s failed", message.label, self.name)


class _Mqtt:
    """A paho client on its own network thread that reconnects by itself; QoS 1 publishes are counted on PUBACK."""

    def __init__(self, config: MqttConfig, count: Count) -> None:
        self.name = f"MQTT broker {config.host}:{config.port}"
        self._count = count
        self._connected = threading.Event()
        self._trouble_logged = False  # log a broker that is down or refuses us once, not at every retry
        self._acks = threading.Condition()
        self._handed = 0  # publishes handed to paho
        self._acked = 0
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"filterforward-cloud-{uuid.uuid4().hex[:12]}")
        if config.username is not None:
            client.username_pw_set(config.username, config.password)
        client.enable_logger(log)
        client.reconnect_delay_set(min_delay=1, max_delay=MQTT_RECONNECT_MAX)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        client.connect_async(config.host, config.port, keepalive=30)
        client.loop_start()
        self._client = client

    def send(self, message: _Message, stop: threading.Event) -> None:
        # Wait here while the broker is away, so the backlog stays in the bounded outbox rather than in paho.
        while not self._connected.wait(0.2):
            if stop.is_set():
                self._count("mqtt_failed", 1)
                return
        with self._acks:  # counted before publishing: its PUBACK may arrive before publish() returns
            self._handed += 1
        info = self._client.publish(message.topic, message.body, qos=1)
        if info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):  # NO_CONN: paho resends it on reconnect
            with self._acks:
                self._handed -= 1
            log.warning("%s refused %s: %s", self.name, message.label, mqtt.error_string(info.rc))
            self._count("mqtt_failed", 1)

    def close(self, deadline: float) -> None:
        """Wait for outstanding PUBACKs until `deadline`, count the rest as failed, disconnect."""
        with self._acks:
            self._acks.wait_for(lambda: self._acked >= self._handed, max(0.0, deadline - time.monotonic()))
            unacked = self._handed - self._acked
            self._handed = self._acked  # so late PUBACKs cannot make the counts add up to more than was sent
        if unacked:
            log.warning("%s did not acknowledge %d notifications before close", self.name, unacked)
            self._count("mqtt_failed", unacked)
        self._client.disconnect()
        self._client.loop_stop()

    def _on_connect(
        self,
        client: mqtt.Client,
        userdata: object,
        flags: mqtt.ConnectFlags,
        reason: ReasonCode,
        props: Properties | None,
    ) -> None:
        if reason.is_failure:
            if not self._trouble_logged:
                log.error("%s refused the connection: %s; check mqtt.username and mqtt.password", self.name, reason)
                self._trouble_logged = True
            return
        log.info("%s connected", self.name)
        self._trouble_logged = False
        self._connected.set()

    def _on_connect_fail(self, client: mqtt.Client, userdata: object) -> None:
        if not self._trouble_logged:
            log.warning("%s unreachable; notifications wait in the queue and go out when it is back", self.name)
            self._trouble_logged = True

    def _on_disconnect(
        self,
        client: mqtt.Client,
        userdata: object,
        flags: mqtt.DisconnectFlags,
        reason: ReasonCode,
        props: Properties | None,
    ) -> None:
        if self._connected.is_set():
            log.warning("%s disconnected (%s); reconnecting", self.name, reason)
        self._connected.clear()

    def _on_publish(
        self, client: mqtt.Client, userdata: object, mid: int, reason: ReasonCode, props: Properties | None
    ) -> None:
        with self._acks:
            if self._acked >= self._handed:  # a PUBACK after close() gave up on it: already counted as failed
                return
            self._acked += 1
            self._acks.notify_all()
        self._count("mqtt_published", 1)


def _post_webhook(url: str, count: Count, message: _Message, stop: threading.Event) -> None:
    """POST the JSON; 3 tries with backoff, then log and count the failure."""
    request = urllib.request.Request(
        url, data=message.body, method="POST", headers={"Content-Type": "application/json"}
    )
    for attempt in range(WEBHOOK_TRIES):
        try:
            with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT) as response:
                response.read()
            count("webhook_sent", 1)
            return
        except (OSError, HTTPException) as error:  # URLError and HTTPError (4xx/5xx) are OSErrors
            failure = error
        if attempt + 1 < WEBHOOK_TRIES and stop.wait(WEBHOOK_BACKOFF * 2**attempt):
            break
    log.warning(
        "webhook %s failed %d times for %s, giving up: %s", _display(url), WEBHOOK_TRIES, message.label, failure
    )
    count("webhook_failed", 1)


class Notifier:
    """publish() queues an event start/end for the MQTT broker and each webhook; close() flushes (bounded wait)."""

    def __init__(self, config: CloudConfig, *, queue_size: int = 1000, close_wait: float = 10.0) -> None:
        self.counts: dict[str, int] = dict.fromkeys(COUNT_NAMES, 0)
        self._lock = threading.Lock()
        self._close_wait = close_wait
        # MqttConfig has validated the prefix (no wildcards).
        self._prefix = config.mqtt.topic_prefix.rstrip("/") if config.mqtt else "filterforward"
        self._mqtt = _Mqtt(config.mqtt, self._count) if config.mqtt else None
        self._outboxes: list[_Outbox] = []
        if self._mqtt is not None:
            self._outboxes.append(_Outbox(self._mqtt.name, self._mqtt.send, queue_size, self._count, "mqtt_failed"))
        for url in map(str, config.webhooks):
            send = functools.partial(_post_webhook, url, self._count)
            self._outboxes.append(_Outbox(f"webhook {_display(url)}", send, queue_size, self._count, "webhook_failed"))

    def publish(self, notification: Notification) -> None:
        """Queue one notification for every destination; never blocks (a full queue drops its oldest)."""
        event = notification.event
        topic = f"{self._prefix}/{topic_level(event['camera'])}/{topic_level(event['filter'])}/{notification.phase}"
        body = json.dumps({**event, "phase": notification.phase}, default=str).encode()
        message = _Message(f"event {event.get('uid')} {notification.phase}", topic, body)
        for outbox in self._outboxes:
            outbox.put(message)

    def close(self) -> None:
        """Send what is queued, waiting at most `close_wait` seconds in all; what is left is counted as failed."""
        deadline = time.monotonic() + self._close_wait
        for outbox in self._outboxes:
            outbox.finish()
        for outbox in self._outboxes:
            outbox.join(deadline)
        if self._mqtt is not None:
            self._mqtt.close(deadline)

    def _count(self, name: str, n: int) -> None:
        with self._lock:
            self.counts[name] += n
