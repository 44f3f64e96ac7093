"""The edge's Prometheus endpoint: http://0.0.0.0:PORT/metrics while the node runs.

A custom collector reads live values at scrape time through the callables it is given (per-camera numbers,
the uplink's counters, the filter sync's version), so nothing is kept in step; it lives in its own
CollectorRegistry, never the process-global one. Counters are cumulative since the node started; fps and
the per-frame times are gauges over the last stats window.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common.listening import cannot_listen

log = logging.getLogger(__name__)

PREFIX = "filterforward_edge"
Values = Mapping[str, Any]

# (key in the camera's values, counter?, help)
CAMERA_METRICS = (
    ("fps", False, "frames processed per second over the last stats window"),
    ("decode_ms", False, "mean decode time per frame (ms) over the source's recent window"),
    ("base_ms", False, "mean base-DNN time per frame (ms) over the last stats window"),
    ("mc_ms", False, "mean time of all MCs per frame (ms) over the last stats window"),
    ("frames", True, "frames processed"),
    ("matched", True, "frames matched by at least one filter"),
    ("skipped", True, "frames the change gate found unchanged (the last processed frame's scores reused)"),
    ("dropped", True, "frames decoded but never processed: processing fell behind the camera"),
    ("capped", True, "frames of a live camera over its fps option, left out by design"),
    ("online", False, "1 while the camera delivers frames"),
)
# (key in Uplink.stats(), metric name, counter?, help)
UPLINK_METRICS = (
    ("spool_messages", "spool_messages", False, "messages spooled, not yet acknowledged by the cloud"),
    ("spool_bytes", "spool_bytes", False, "bytes of the spooled messages"),
    ("spool_dropped", "spool_dropped", True, "spooled messages dropped: over the spool's bound or a full disk"),
    ("in_flight", "in_flight", False, "messages sent and not yet acknowledged"),
    ("sent_messages", "sent_messages", True, "messages sent to the cloud, resends included"),
    ("sent_bytes", "sent_bytes", True, "bytes sent to the cloud, resends included"),
    ("acked", "acked", True, "messages the cloud acknowledged"),
    ("connected", "cloud_reachable", False, "1 while the cloud answers within the link's timeout"),
    (
        "refusals",
        "cloud_refusals",
        True,
        "answers of the cloud refusing a message (an edge key it no longer allows, "
        "a message naming another edge: the log says why once); a growing count needs an operator",
    ),
    ("refused", "refused", True, "spooled messages the cloud refuses for good (another edge's name), dropped"),
    ("footage_recording", "footage_recording", False, "footage requests being recorded"),
    ("footage_recorded", "footage_recorded", True, "footage frames recorded to the edge's disk"),
    ("footage_waiting", "footage_waiting", False, "footage messages recorded, not yet spooled"),
    ("footage_spooled", "footage_spooled", True, "footage frames spooled for the cloud"),
)


class EdgeCollector(Collector):
    """Prometheus metrics of one running edge node."""

    def __init__(
        self,
        edge: str,
        cameras: Callable[[], Mapping[str, Values]],
        uplink: Callable[[], Values] | None = None,
        filters: Callable[[], Values] | None = None,
    ) -> None:
        self._edge = edge
        self._cameras = cameras  # camera name -> the keys of CAMERA_METRICS
        self._uplink = uplink  # Uplink.stats(), when the node has a cloud link
        self._filters = filters  # filters_version and filter_errors, with a cloud link

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(f"{PREFIX}_info", "this edge node", labels=["edge"])
        info.add_metric([self._edge], 1.0)
        yield info
        cameras = self._cameras()
        for key, counter, help_text in CAMERA_METRICS:
            family = _family(f"camera_{key}", counter, help_text, ["camera"])
            for name, values in cameras.items():
                family.add_metric([name], float(values[key]))
            yield family
        if self._uplink is not None:
            values = self._uplink()
            for key, name, counter, help_text in UPLINK_METRICS:
                if key in values:  # the footage counters come with a footage recorder
                    yield _single(f"uplink_{name}", counter, help_text, float(values[key]))
        if self._filters is not None:
            values = self._filters()
            yield _single("filters_version", False, "the cloud's filter set in the bank", values["filters_version"])
            yield _single("filter_errors", True, "filters from the cloud that cannot run here", values["filter_errors"])


def _family(name: str, counter: bool, help_text: str, labels: list[str]) -> CounterMetricFamily | GaugeMetricFamily:
    kind = CounterMetricFamily if counter else GaugeMetricFamily
    return kind(f"{PREFIX}_{name}", help_text, labels=labels)


def _single(name: str, counter: bool, help_text: str, value: float) -> Metric:
    kind = CounterMetricFamily if counter else GaugeMetricFamily
    return kind(f"{PREFIX}_{name}", help_text, value=float(value))


class MetricsServer:
    """Serves one collector at http://0.0.0.0:PORT/metrics from a daemon thread until `close()`."""

    def __init__(self, port: int, collector: Collector, address: str = "0.0.0.0") -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        try:
            self._server, self._thread = start_http_server(port, address, registry=registry)
        except OSError as exc:
            raise cannot_listen("serve metrics", address, port, exc, "metrics_port", "the address it binds") from None
        self.port = self._server.server_address[1]
        log.info("metrics at http://%s:%d/metrics", address, self.port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
