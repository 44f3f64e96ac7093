"""Filter distribution (Clone pattern) from a real cloud registry, publisher and ingest into a real MC bank on the
edge."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from sqlalchemy import select
from support import wait_until
from test_uplink import EDGE, PUBLISH_POLL, Cloud, Keys, close, make_uplink

from cloud.db import Camera, Edge, Filter, FilterChange
from cloud.db import Event as EventRow
from cloud.registry import Registry
from edge.config import CameraConfig, EdgeConfig, SpoolConfig
from edge.filtercache import FilterCache
from edge.filtersync import FilterSync
from edge.mcbank import MCBank
from edge.node import EdgeNode
from models.filterspec import Encoding, FilterSpec
from models.taps import EFFICIENTNET_LITE0_TAPS

SIZE = (128, 96)


class Edgeside:
    """An edge's bank, link, uplink and filter sync, as the edge node wires them."""

    def __init__(
        self,
        cloud: Cloud,
        folder: Path,
        local: Sequence[tuple[FilterSpec, bytes]] = (),
        cache: FilterCache | None = None,
    ):
        self.bank = MCBank(EFFICIENTNET_LITE0_TAPS, SIZE, workers=1)
        self.bank.put_many(list(local))
        self.link, self.uplink = make_uplink(cloud.link(cloud.keys.edge(EDGE) if cloud.keys else None), folder)
        local_filters = {spec.name: (spec, onnx) for spec, onnx in local}
        self.sync = FilterSync(self.bank, self.link, ["gate"], local_filters, cache)
        self.link.start()
        self.sync.start()
        assert self.sync.synced.wait(30)

    def close(self) -> None:
        self.sync.close()
        close(self.link, self.uplink)
        self.bank.close()


@pytest.fixture(params=["insecure"])
def cloud(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cloud]:
    """The cloud; a test parametrized indirectly with "curve" gets one with CURVE and an edge allow-list."""
    cloud = Cloud(tmp_path / "cloud", Keys(tmp_path / "keys") if request.param == "curve" else None)
    cloud.start()
    yield cloud
    cloud.stop()


@pytest.fixture
def registry(cloud: Cloud) -> Registry:
    return Registry(cloud.sessions, 16 * 2**20, on_change=cloud.filters_changed.set)


@pytest.mark.parametrize("cloud", ["insecure", "curve"], indirect=True)
def test_snapshot_then_put_update_and_delete_reach_the_bank_in_order(
    cloud: Cloud, registry: Registry, make_filter, tmp_path: Path
) -> None:
    spec_a, onnx_a = make_filter("full_frame", "late", SIZE, name="a")
    registry.create(spec_a, onnx_a)
    edge = Edgeside(cloud, tmp_path)
    assert set(edge.bank.filters) == {"a"} and edge.sync.version == 1  # from the snapshot

    registry.create(*make_filter("localized", "late", SIZE, name="b"))
    wait_until(lambda: edge.sync.version == 2)
    assert set(edge.bank.filters) == {"a", "b"}

    registry.update("a", spec_a.model_copy(update={"event": "renamed"}), None)
    wait_until(lambda: edge.sync.version == 3)
    assert edge.bank.filters["a"].version == 2 and edge.bank.filters["a"].event == "renamed"

    registry.delete("b")
    wait_until(lambda: edge.sync.version == 4)
    assert set(edge.bank.filters) == {"a"}

    def announced() -> int:
        with cloud.sessions() as session:
            return session.get(Edge, EDGE).filters_version

    wait_until(lambda: announced() == 4)  # the edge tells the cloud which version it runs
    edge.close()


def test_a_change_reaches_the_edge_on_the_registry_s_wake_up_not_a_poll(
    cloud: Cloud, registry: Registry, make_filter, tmp_path: Path
) -> None:
    assert PUBLISH_POLL >= 3600  # the publisher's safety-net poll never fires here: only the wake-up can publish
    edge = Edgeside(cloud, tmp_path)
    assert edge.sync.version == 0
    registry.create(*make_filter("full_frame", "late", SIZE, name="a"))
    wait_until(lambda: edge.sync.version == 1, "the change, published on the registry's wake-up")
    assert set(edge.bank.filters) == {"a"} and cloud.publisher.counts["published"] == 1
    edge.close()


def test_local_filters_other_cameras_and_filters_that_cannot_load(
    cloud: Cloud, registry: Registry, make_filter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mine = make_filter("full_frame", "late", SIZE, name="mine")
    shared = make_filter("full_frame", "late", SIZE, name="shared", event="local")
    edge = Edgeside(cloud, tmp_path, local=[mine, shared])
    assert set(edge.bank.filters) == {"mine", "shared"} and edge.sync.version == 0

    registry.create(*make_filter("full_frame", "late", SIZE, name="shared", event="cloud"))
    registry.create(*make_filter("full_frame", "late", SIZE, name="elsewhere", cameras=["other-camera"]))
    with caplog.at_level("ERROR", logger="edge.filtersync"):
        registry.create(*make_filter("full_frame", "late", (160, 96), name="wrong-size"))
        wait_until(lambda: edge.sync.version == 3)
    assert edge.bank.filters["shared"].event == "cloud"  # the cloud's filter of a local name wins
    assert set(edge.bank.filters) == {"mine", "shared"}  # not for this edge's cameras; cannot run here
    assert edge.sync.errors == 1 and "filter wrong-size (version 3)" in caplog.text

    registry.delete("shared")
    wait_until(lambda: edge.sync.version == 4)
    assert edge.bank.filters["shared"].event == "local"  # the local bundle is back
    edge.close()


def test_a_gap_in_the_versions_brings_a_new_snapshot(
    cloud: Cloud, registry: Registry, make_filter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registry.create(*make_filter("full_frame", "late", SIZE, name="a"))
    edge = Edgeside(cloud, tmp_path)
    spec, onnx = make_filter("full_frame", "late", SIZE, name="c")
    with cloud.sessions.begin() as session:  # version 2 is lost: the publisher sends 3 only
        session.add(Filter(name="c", spec=spec.model_dump(mode="json"), onnx=onnx, revision=3))
        session.add(FilterChange(version=3, name="c", action="put"))
    cloud.filters_changed.set()  # as the registry does after its commits
    with caplog.at_level("WARNING", logger="edge.filtersync"):
        wait_until(lambda: edge.sync.version == 3)
    assert "jumped from version 1 to 3" in caplog.text
    assert set(edge.bank.filters) == {"a", "c"}
    edge.close()


def test_after_a_cloud_restart_the_edge_catches_up(
    cloud: Cloud, registry: Registry, make_filter, tmp_path: Path
) -> None:
    registry.create(*make_filter("full_frame", "late", SIZE, name="a"))
    edge = Edgeside(cloud, tmp_path)
    cloud.stop()
    registry.delete("a")  # changed while no publisher runs to send it
    registry.create(*make_filter("full_frame", "late", SIZE, name="d"))
    cloud.start()
    wait_until(lambda: edge.sync.version == 3)
    assert set(edge.bank.filters) == {"d"}
    with cloud.sessions() as session:
        assert session.scalar(select(Filter.name)) == "d"
    edge.close()


def test_a_cloud_restart_that_changed_nothing_is_not_announced_again(
    cloud: Cloud, registry: Registry, make_filter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registry.create(*make_filter("full_frame", "late", SIZE, name="a"))
    with caplog.at_level(logging.DEBUG, logger="edge.filtersync"):
        edge = Edgeside(cloud, tmp_path)
        cloud.stop()
        cloud.start()

        def in_step() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.getMessage().startswith("filters in step")]

        wait_until(lambda: len(in_step()) >= 2)  # the snapshot after the restart was applied
        edge.close()
    assert [r.levelno for r in in_step()][:2] == [logging.INFO, logging.DEBUG]


def node_config(cloud: Cloud, clip: Path, base_model: Path, folder: Path) -> EdgeConfig:
    """An edge node on the clip (every frame) linked to the cloud."""
    return EdgeConfig(
        edge_id=EDGE,
        base_model=base_model,
        input_size=SIZE,
        cameras=[CameraConfig(name="gate", source=str(clip), pacing="every-frame")],
        cloud=cloud.link(),
        spool=SpoolConfig(path=folder / "spool"),
        stats_interval=0.2,
    )


def test_an_edge_node_runs_the_cloud_s_filters_and_sends_its_matches_up(
    cloud: Cloud, registry: Registry, make_filter, short_clip: Path, base_model: Path, tmp_path: Path
) -> None:
    jpeg = Encoding(kind="jpeg")  # one message per frame: the seqs below are the 40 frames'
    registry.create(*make_filter("full_frame", "late", SIZE, name="always", bias=10.0, encoding=jpeg))
    config = node_config(cloud, short_clip, base_model, tmp_path)
    node = EdgeNode(config)
    assert node.sink is node.uplink
    node.run()  # to the end of the 40-frame clip; waits for the cloud to take everything

    assert node.uplink.spool.messages == 0
    last = node.uplink.spool.last_seq  # the event's end; its start went before the 40 frames
    assert sorted(cloud.stored_seqs()) == list(range(last - 40, last))
    with cloud.sessions() as session:
        event = session.scalar(select(EventRow))
        assert (event.filter, event.start_frame, event.end_frame) == ("always", 0, 39)
        assert session.get(Edge, EDGE).filters_version == 1

    def offline() -> bool:  # the last stats go up on the way out, unspooled: the cloud may store them a moment later
        with cloud.sessions() as session:
            camera = session.get(Camera, (EDGE, "gate"))
            return camera is not None and camera.stats["online"] is False

    wait_until(offline, "the edge's last stats to show the camera offline")


def test_an_edge_restarted_while_the_cloud_is_down_runs_the_cloud_s_filters_it_had(
    cloud: Cloud, registry: Registry, make_filter, tmp_path: Path
) -> None:
    registry.create(*make_filter("full_frame", "late", SIZE, name="a"))
    registry.create(*make_filter("full_frame", "late", SIZE, name="elsewhere", cameras=["other-camera"]))
    edge = Edgeside(cloud, tmp_path, cache=FilterCache(tmp_path / "kept"))
    registry.create(*make_filter("localized", "late", SIZE, name="b"))
    wait_until(lambda: edge.sync.version == 3)
    edge.close()
    cloud.stop()  # a power cut during an outage: the edge starts again with no cloud to ask
    registry.delete("a")  # meanwhile

    bank = MCBank(EFFICIENTNET_LITE0_TAPS, SIZE, workers=1)
    link, uplink = make_uplink(cloud.link(), tmp_path / "again")
    sync = FilterSync(bank, link, ["gate"], cache=FilterCache(tmp_path / "kept"))
    link.start()
    sync.start()
    assert set(bank.filters) == {"a", "b"} and sync.restored == 2 and not sync.synced.is_set()
    cloud.start()
    wait_until(lambda: set(bank.filters) == {"b"} and sync.version == 4, "the cloud's snapshot")
    wait_until(lambda: [spec.name for spec, _ in FilterCache(tmp_path / "kept").load()] == ["b"], "b alone kept")
    sync.close()
    close(link, uplink)
    bank.close()


def test_kept_filters_that_are_damaged_are_left_out_and_a_failed_save_keeps_the_last_set(
    make_filter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = FilterCache(tmp_path / "kept")
    assert cache.load() == []  # nothing saved yet
    a, b = make_filter("full_frame", "late", SIZE, name="a"), make_filter("full_frame", "late", SIZE, name="b")
    cache.save(7, [a, b])
    assert cache.load() == [a, b]
    cache.save(8, [a])  # b's model is not kept once b is gone
    assert cache.load() == [a] and len(list((tmp_path / "kept").glob("*.onnx"))) == 1

    [model] = (tmp_path / "kept").glob("*.onnx")
    model.write_bytes(model.read_bytes()[:-1])
    with caplog.at_level("WARNING", logger="edge.filtercache"):
        assert cache.load() == []
    assert "filter a kept from the cloud has an altered model; not used" in caplog.text

    (tmp_path / "kept" / "index.json").write_text("{not json")
    with caplog.at_level("WARNING", logger="edge.filtercache"):
        assert cache.load() == []
    assert "cannot be read, so none are used" in caplog.text

    blocked = FilterCache(tmp_path / "a-file" / "kept")
    (tmp_path / "a-file").write_text("in the way")
    with caplog.at_level("WARNING", logger="edge.filtercache"):
        blocked.save(9, [a])  # logged, not raised: the edge goes on filtering
    assert "could not keep the cloud's filters on disk" in caplog.text


def test_an_edge_node_started_during_an_outage_spools_the_matches_of_the_cloud_s_filters(
    cloud: Cloud, registry: Registry, make_filter, short_clip: Path, base_model: Path, tmp_path: Path
) -> None:
    jpeg = Encoding(kind="jpeg")  # one message per frame
    registry.create(*make_filter("full_frame", "late", SIZE, name="always", bias=10.0, encoding=jpeg))
    config = node_config(cloud, short_clip, base_model, tmp_path)
    EdgeNode(config).run()  # the cloud's filter reaches the edge, which keeps it
    cloud.stop()

    node = EdgeNode(config)
    node.run()  # the whole clip while the cloud is down
    assert set(node.bank.filters) == {"always"} and node.filtersync.restored == 1
    assert node.uplink.spool.messages >= 40  # every frame matched and waits for the cloud (with the event's start/end)
