"""Cache files are written whole: a reader sees the old file or the new one, and two writers of one file at once
(an edge and a trainer exporting the base model at first start) never write into the same temporary file."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from filterforward.cli import main
from models.cache import cache_dir, written_whole


def test_a_file_appears_only_when_its_block_ends(tmp_path: Path) -> None:
    target = tmp_path / "model.onnx"
    target.write_bytes(b"old")
    with written_whole(target) as temporary:
        temporary.write_bytes(b"new")
        assert target.read_bytes() == b"old"  # readers meanwhile still get the whole old file
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


def test_a_failed_write_keeps_the_old_file_and_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "model.onnx"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), written_whole(target) as temporary:
        temporary.write_bytes(b"half")
        raise RuntimeError("export failed")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


def test_concurrent_writers_of_one_file_each_write_their_own_and_one_wins_whole(tmp_path: Path) -> None:
    target = tmp_path / "model.onnx"
    contents = [bytes([i]) * 1_000_000 for i in range(4)]
    everyone_writing = threading.Barrier(len(contents))
    temporaries: list[Path] = []

    def write(data: bytes) -> None:
        with written_whole(target) as temporary:
            temporaries.append(temporary)
            with temporary.open("wb") as file:
                file.write(data[: len(data) // 2])
                everyone_writing.wait(timeout=30)  # every writer has its file half written before any finishes
                file.write(data[len(data) // 2 :])

    threads = [threading.Thread(target=write, args=(data,)) for data in contents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(temporaries)) == len(contents)
    assert target.read_bytes() in contents
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


def test_a_cache_folder_that_cannot_be_made_says_which_setting_to_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said "/tmp/x/base: Not a directory (-v shows where)": nothing about the cache or FILTERFORWARD_CACHE."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    monkeypatch.setenv("FILTERFORWARD_CACHE", str(a_file))
    assert main(["models", "export"]) == 2
    expected = f"cannot make {a_file / 'base'} in FILTERFORWARD_CACHE: Not a directory; point FILTERFORWARD_CACHE at"
    assert expected in capsys.readouterr().err
    with pytest.raises(OSError):  # still an OSError, for the callers that do without the cache (frame counts)
        cache_dir("frame-counts")
