"""The frame store: atomic writes under root/{frames,clips}/<edge>/<camera>/, sanitised names, no way out of root."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cloud.framestore import FrameStore
from models.errors import FilterForwardError


@pytest.fixture
def store(tmp_path: Path) -> FrameStore:
    return FrameStore(tmp_path / "store")


def test_write_returns_a_relative_path_that_opens(store: FrameStore) -> None:
    relative = store.write("frames", "edge-1", "cam-1", "run-7.jpg", b"jpeg bytes")

    assert relative == "frames/edge-1/cam-1/run-7.jpg"
    assert store.open_path(relative).read_bytes() == b"jpeg bytes"
    assert store.total_bytes() == len(b"jpeg bytes")


def test_write_replaces_atomically_and_leaves_no_temporary_file(store: FrameStore) -> None:
    relative = store.write("clips", "edge-1", "cam-1", "clip.mp4", b"old")
    store.write("clips", "edge-1", "cam-1", "clip.mp4", b"new clip")

    assert store.open_path(relative).read_bytes() == b"new clip"
    assert os.listdir(store.root / "clips/edge-1/cam-1") == ["clip.mp4"]


@pytest.mark.parametrize(
    ("edge", "camera", "name"),
    [("..", "..", "../../etc/passwd"), ("/abs", "a/b", "/x.jpg"), (".", "", ".hidden"), ("e", "c", "a\\..\\b\x00")],
)
def test_hostile_names_are_sanitised_into_the_store(store: FrameStore, edge: str, camera: str, name: str) -> None:
    relative = store.write("frames", edge, camera, name, b"x")

    path = store.open_path(relative)
    assert path.is_relative_to(store.root)
    assert len(Path(relative).parts) == 4
    assert not any(part.startswith(".") for part in Path(relative).parts)


def test_unknown_kind_is_refused(store: FrameStore) -> None:
    with pytest.raises(FilterForwardError, match="unknown payload kind"):
        store.write("secrets", "e", "c", "n", b"x")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "relative",
    [
        "../outside.txt",
        "frames/../../outside.txt",
        "/etc/passwd",
        "C:/windows",
        "frames\\..\\..\\outside.txt",
        "",
        "a\x00b",
    ],
)
def test_open_path_refuses_paths_that_escape(store: FrameStore, relative: str) -> None:
    (store.root.parent / "outside.txt").write_text("secret")

    with pytest.raises(FilterForwardError, match="refused path") as caught:
        store.open_path(relative)
    assert "\n" not in str(caught.value)
    with pytest.raises(FilterForwardError, match="refused path"):
        store.delete(relative)
    assert (store.root.parent / "outside.txt").exists()


def test_symlinks_out_of_the_store_are_refused(store: FrameStore, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    (store.root / "frames").mkdir()
    (store.root / "frames" / "link.jpg").symlink_to(secret)
    (store.root / "clips").symlink_to(tmp_path)

    for relative in ("frames/link.jpg", "clips/secret.txt"):
        with pytest.raises(FilterForwardError, match="outside the frame store"):
            store.open_path(relative)
        with pytest.raises(FilterForwardError, match="outside the frame store"):
            store.delete(relative)
    assert secret.read_text() == "secret"


def test_missing_file_is_a_clear_error_and_deleting_it_frees_nothing(store: FrameStore) -> None:
    with pytest.raises(FilterForwardError, match=r"no stored file at 'frames/e/c/gone\.jpg'"):
        store.open_path("frames/e/c/gone.jpg")
    assert store.delete("frames/e/c/gone.jpg") == 0


def test_delete_returns_bytes_freed(store: FrameStore) -> None:
    relative = store.write("frames", "e", "c", "n.jpg", b"12345")

    assert store.delete(relative) == 5
    assert store.delete(relative) == 0
    assert store.total_bytes() == 0


def test_unfinished_writes_of_a_killed_process_are_removed_once_old(store: FrameStore) -> None:
    relative = store.write("frames", "edge-1", "gate", "1.jpg", b"kept")
    folder = (store.root / relative).parent
    stale, fresh = folder / ".tmp-killed", folder / ".tmp-writing"
    stale.write_bytes(b"x" * 1000)
    fresh.write_bytes(b"y" * 10)
    os.utime(stale, (time.time() - 7200, time.time() - 7200))  # left by a process killed two hours ago
    assert store.remove_orphans(older_than=3600) == (1, 1000)
    assert not stale.exists() and fresh.exists()  # a write in progress is left alone
    assert store.remove_orphans(older_than=0) == (1, 10)  # at start-up nothing is writing: all are orphans
    assert store.open_path(relative).read_bytes() == b"kept"
