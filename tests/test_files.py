"""common.files: names from the wire stay inside their folder; files are written whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common.files import MAX_NAME, TEMPORARY, safe_name, write_atomically


@pytest.mark.parametrize(
    ("text", "name"),
    [("cam-1/evt.3", "cam-1_evt.3"), ("", "_"), (".", "_"), ("..", "_."), (".hidden", "_hidden"), ("a b\n", "a_b_")],
)
def test_safe_name_is_one_visible_path_part(text: str, name: str) -> None:
    assert safe_name(text) == name


def test_safe_name_is_bounded() -> None:
    assert len(safe_name("x" * 1000)) == MAX_NAME


def test_write_atomically_replaces_the_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "frame.jpg"
    write_atomically(target, b"old")
    write_atomically(target, b"new contents")
    assert target.read_bytes() == b"new contents"
    assert sorted(p.name for p in target.parent.iterdir()) == ["frame.jpg"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "frame.jpg"
    write_atomically(target, b"old")
    with pytest.raises(TypeError):
        write_atomically(target, "not bytes")  # type: ignore[arg-type]  # fails inside the write
    assert target.read_bytes() == b"old"
    assert not list(tmp_path.glob(f"{TEMPORARY}*"))


def test_a_written_file_gets_the_mode_open_would_give_it(tmp_path: Path) -> None:
    """Reports, frames and dataset files are read by other users and tools (a web server, a trainer container):
    the temporary file's private mode must not stick to them."""
    target = tmp_path / "report.json"
    write_atomically(target, b"{}")
    plain = tmp_path / "plain.json"
    plain.write_bytes(b"{}")
    assert os.stat(target).st_mode & 0o777 == os.stat(plain).st_mode & 0o777
