"""Event start/end notifications to MQTT and webhooks, sent from background threads so ingest never waits on them.

Each channel type (CHANNELS) brings its key of the cloud config with the settings it takes, its counters and
the senders those settings set up: cloud.config builds its notification keys from it, and the Notifier
queues every event for every sender.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from http.client import HTTPException
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from pydantic import BaseModel, ConfigDict, Field, HttpUrl

from cloud.links import clip_path, event_path, frame_path
from models.registry import Registry

if TYPE_CHECKING:
    from cloud.config import CloudConfig
    from cloud.storage import Notification

log = logging.getLogger(__name__)

DROPPED = "dropped"  # the counter of messages a full or closed queue threw away, whatever the channel
WEBHOOK_TRIES = 3
WEBHOOK_TIMEOUT = 5.0  # seconds per try
WEBHOOK_BACKOFF = 0.5  # seconds before the 2nd try, doubled before each later one
MQTT_RECONNECT_MAX = 10  # seconds between reconnect attempts at most, so a broker that is back gets the backlog soon
DROP_LOG_EVERY = 100  # a full queue logs its 1st drop and every 100th, not each one

Count = Callable[[str, int], None]


@dataclass(frozen=True)
class Message:
    label: str  # names the notification in logs
    topic: str  # <camera>/<filter>/<start|end>, plain MQTT topic levels below a channel's own prefix
    body: bytes


@dataclass(frozen=True)
class Tally:
    """One channel type's counters: messages delivered, and messages given up on."""

    count: Count
    delivered: str
    failed: str

    def sent(self, n: int = 1) -> None:
        self.count(self.delivered, n)

    def lost(self, n: int = 1) -> None:
        self.count(self.failed, n)


class Sender(Protocol):
    """One destination; send() runs on its outbox's thread, close() after the outbox is drained."""

    name: str  # for logs

    def send(self, message: Message, stop: threading.Event) -> None: ...

    def close(self, deadline: float) -> None: ...


@dataclass(frozen=True)
class ChannelType:
    """A kind of notification destination, as the cloud config sets it up."""

    name: str  # its key in the cloud config
    field: tuple[Any, Any]  # that key's type and default (or pydantic Field)
    counters: tuple[str, str]  # its Tally's names: delivered, failed
    open: Callable[[Any, Tally], list[Sender]]  # the senders the key's value asks for (none when unset)


def payload(notification: Notification, base_url: str) -> dict[str, Any]:
    """The JSON every channel sends for a notification: the event, links to it in the REST API, the phase."""
    event = notification.event
    fields = asdict(event)
    del fields["thumbnail"]  # a link below instead
    # its thumbnail frame, else the clip that stands in for it
    frame = frame_path(event.thumbnail) if event.thumbnail is not None else clip_path(event.id)
    return {
        **fields,
        "started_at": event.started_at.isoformat(),
        "ended_at": event.ended_at.isoformat() if event.ended_at else None,
        "url": base_url + event_path(event.id),
        "frame_url": base_url + frame,
        "phase": notification.phase,
    }


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

    def __init__(self, sender: Sender, size: int, tally: Tally) -> None:
        self.name = sender.name
        self._send = sender.send
        self._size = size
        self._tally = tally
        self._items: deque[Message] = deque()
        self._wake = threading.Condition()
        self._closing = False
        self._dropped = 0
        self.stop = threading.Event()  # set when close gives up waiting: senders stop waiting and retrying
        self._thread = threading.Thread(target=self._run, name=f"notify {self.name}", daemon=True)
        self._thread.start()

    def put(self, message: Message) -> None:
        with self._wake:
            if self._closing:
                dropped: Message | None = message
            else:
                dropped = self._items.popleft() if len(self._items) >= self._size else None
                self._items.append(message)
                self._wake.notify()
            if dropped is not None:
                self._dropped += 1
                total = self._dropped
        if dropped is not None:
            self._tally.count(DROPPED, 1)
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
            self._tally.lost(left)

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


class MqttConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = Field(min_length=1, description="the MQTT broker's host name or address")
    port: int = Field(1883, ge=1, le=65535)
    username: str | None = None
    password: str | None = None
    topic_prefix: str = Field(
        "filterforward",
        pattern=r"^[^+#\x00/][^+#\x00]*$",
        description="events go to <prefix>/<camera>/<filter>/<start|end>; plain topic levels, no + or #",
    )


class _Mqtt:
    """A paho client on its own network thread that reconnects by itself; QoS 1 publishes are counted on PUBACK."""

    def __init__(self, config: MqttConfig, tally: Tally) -> None:
        self.name = f"MQTT broker {config.host}:{config.port}"
        self._prefix = config.topic_prefix.rstrip("/")  # validated: no wildcards
        self._tally = tally
        self._connected = threading.Event()
        self._trouble_logged = False  # log a broker that is down or refuses us once, not at every retry
        self._acks = threading.Condition()
        self._handed = 0  # publishes handed to paho
        self._acked = 0
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"filterforward-cloud-{uuid.uuid4().hex[:12]}")
        if config.username is not None:
            client.username_pw_set(config.username, config.password)
        client.reconnect_delay_set(min_delay=1, max_delay=MQTT_RECONNECT_MAX)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        client.connect_async(config.host, config.port, keepalive=30)
        client.loop_start()
        self._client = client

    def send(self, message: Message, stop: threading.Event) -> None:
        # Wait here while the broker is away, so the backlog stays in the bounded outbox rather than in paho.
        while not self._connected.wait(0.2):
            if stop.is_set():
                self._tally.lost()
                return
        with self._acks:  # counted before publishing: its PUBACK may arrive before publish() returns
            self._handed += 1
        info = self._client.publish(f"{self._prefix}/{message.topic}", message.body, qos=1)
        if info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):  # NO_CONN: paho resends it on reconnect
            with self._acks:
                self._handed -= 1
            log.warning("%s refused %s: %s", self.name, message.label, mqtt.error_string(info.rc))
            self._tally.lost()

    def close(self, deadline: float) -> None:
        """Wait for outstanding PUBACKs until `deadline`, count the rest as failed, disconnect."""
        with self._acks:
            self._acks.wait_for(lambda: self._acked >= self._handed, max(0.0, deadline - time.monotonic()))
            unacked = self._handed - self._acked
            self._handed = self._acked  # so late PUBACKs cannot make the counts add up to more than was sent
        if unacked:
            log.warning("%s did not acknowledge %d notifications before close", self.name, unacked)
            self._tally.lost(unacked)
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
        self._tally.sent()


class _Webhook:
    """POSTs the JSON; 3 tries with backoff, then logs and counts the failure."""

    def __init__(self, url: str, tally: Tally) -> None:
        self.name = f"webhook {_display(url)}"
        self._url = url
        self._tally = tally

    def send(self, message: Message, stop: threading.Event) -> None:
        request = urllib.request.Request(
            self._url, data=message.body, method="POST", headers={"Content-Type": "application/json"}
        )
        for attempt in range(WEBHOOK_TRIES):
            try:
                with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT) as response:
                    response.read()
                self._tally.sent()
                return
            except (OSError, HTTPException) as error:  # URLError and HTTPError (4xx/5xx) are OSErrors
                failure = error
            if attempt + 1 < WEBHOOK_TRIES and stop.wait(WEBHOOK_BACKOFF * 2**attempt):
                break
        log.warning("%s failed %d times for %s, giving up: %s", self.name, WEBHOOK_TRIES, message.label, failure)
        self._tally.lost()

    def close(self, deadline: float) -> None:
        """Nothing to wait for: a POST is done when send() returns."""


def _mqtt_senders(config: MqttConfig | None, tally: Tally) -> list[Sender]:
    return [] if config is None else [_Mqtt(config, tally)]


def _webhook_senders(urls: list[HttpUrl], tally: Tally) -> list[Sender]:
    return [_Webhook(str(url), tally) for url in urls]


CHANNELS: Registry[ChannelType] = Registry(
    "notification channel",
    [
        ChannelType("mqtt", (MqttConfig | None, None), ("mqtt_published", "mqtt_failed"), _mqtt_senders),
        ChannelType(
            "webhooks",
            (list[HttpUrl], Field(default_factory=list, description="URLs that get each event start/end as JSON")),
            ("webhook_sent", "webhook_failed"),
            _webhook_senders,
        ),
    ],
)


class Notifier:
    """publish() queues an event start/end for every sender the config's channel keys set up; close() flushes
    (bounded wait)."""

    def __init__(self, config: CloudConfig, base_url: str, *, queue_size: int = 1000, close_wait: float = 10.0) -> None:
        counters = [name for channel in CHANNELS.values() for name in channel.counters]
        self.counts: dict[str, int] = dict.fromkeys([*counters, DROPPED], 0)
        self._lock = threading.Lock()
        self._close_wait = close_wait
        self._base_url = base_url  # the messages link to the event in the REST API under it
        self._senders: list[Sender] = []
        self._outboxes: list[_Outbox] = []
        for channel in CHANNELS.values():
            tally = Tally(self._count, *channel.counters)
            for sender in channel.open(getattr(config, channel.name), tally):
                self._senders.append(sender)
                self._outboxes.append(_Outbox(sender, queue_size, tally))

    def publish(self, notification: Notification) -> None:
        """Queue one notification for every destination; never blocks (a full queue drops its oldest)."""
        event = notification.event
        topic = f"{topic_level(event.camera)}/{topic_level(event.filter)}/{notification.phase}"
        body = json.dumps(payload(notification, self._base_url)).encode()
        message = Message(f"event {event.uid} {notification.phase}", topic, body)
        for outbox in self._outboxes:
            outbox.put(message)

    def close(self) -> None:
        """Send what is queued, waiting at most `close_wait` seconds in all; what is left is counted as failed."""
        deadline = time.monotonic() + self._close_wait
        for outbox in self._outboxes:
            outbox.finish()
        for outbox in self._outboxes:
            outbox.join(deadline)
        for sender in self._senders:
            sender.close(deadline)

    def _count(self, name: str, n: int) -> None:
        with self._lock:
            self.counts[name] += n
