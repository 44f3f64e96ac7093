"""Cache files are written whole: a reader sees the old file or the new one, and two writers of one file at once
(an edge and a trainer exporting the base model at first start) never write into the same temporary file. A bundle's
or a dataset's files are written whole together: a failure leaves the old ones."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from filterforward.cli import main
from models.cache import cache_dir, written_whole

FULL_DISK = """
import resource, signal, sys
from pathlib import Path
from models.cache import write_whole
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
try:
    write_whole(Path(sys.argv[1]), {"spec.json": b"new spec", "model.onnx": bytes(200_000)})
except OSError as exc:
    print(exc.filename, exc.strerror)
"""


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


def test_files_written_together_on_a_full_disk_leave_the_old_ones_whole(tmp_path: Path) -> None:
    """`train --force` over a bundle on a full disk left a cut-off new model beside the old spec."""
    (tmp_path / "spec.json").write_bytes(b"old spec")
    (tmp_path / "model.onnx").write_bytes(b"old model")
    done = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path)], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == f"{tmp_path / 'model.onnx'} File too large", done.stdout + done.stderr
    assert (tmp_path / "spec.json").read_bytes() == b"old spec"  # written in full, but not put in place
    assert (tmp_path / "model.onnx").read_bytes() == b"old model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "spec.json"]
