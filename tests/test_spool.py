"""The uplink's spool on its own: seqs that never repeat, acks, the byte bound, and surviving kill -9."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from common.protocol import JPEG_START, FrameHeader, decode, encode
from edge.spool import FILE_NAME, Spool
from models.errors import FilterForwardError


def message(size: int = 100) -> Callable[[int], list[bytes]]:
    """A builder of a real frame message with a `size`-byte payload and the seq the spool assigns."""

    def build(seq: int) -> list[bytes]:
        header = FrameHeader(
            edge="e1", run="r1", seq=seq, camera="cam", frame=0, timestamp=0.0, wall_time=1.0, scores={}
        )
        return encode(header, JPEG_START + b"x" * (size - len(JPEG_START)))

    return build


def test_seqs_increase_and_survive_reopening_even_when_emptied(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 10**6)
    seqs = [spool.append(message()) for _ in range(3)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    assert spool.first_seq == seqs[0]
    assert spool.ack(seqs[:2]) == 2 and spool.first_seq == seqs[2]  # the cloud may forget the keys below it
    assert spool.ack(seqs) == 1 and spool.messages == 0 and spool.bytes == 0
    assert spool.first_seq == seqs[-1] + 1  # empty: nothing below the next seq comes again
    spool.close()
    assert spool.first_seq == seqs[-1] + 1  # stats are read after the uplink closed

    reopened = Spool(tmp_path, 10**6)
    assert reopened.last_seq == seqs[-1]
    assert reopened.append(message()) == seqs[-1] + 1
    reopened.close()


def test_a_new_spool_does_not_reuse_a_deleted_one_s_seqs(tmp_path: Path) -> None:
    first = Spool(tmp_path / "a", 10**6)
    old = [first.append(message()) for _ in range(5)]
    first.close()
    (tmp_path / "a" / FILE_NAME).unlink()
    second = Spool(tmp_path / "a", 10**6)
    assert second.append(message()) > max(old)
    second.close()


@pytest.mark.parametrize("damage", ["truncated", "overwritten"])
def test_a_damaged_spool_is_moved_aside_and_the_edge_starts_with_an_empty_one(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A disk fault or a copy cut short must not keep the edge from starting (a crash loop that filters nothing):
    the file is kept beside the new one for recovery, and the new one's seqs do not repeat the old ones."""
    first = Spool(tmp_path, 10**7)
    old = [first.append(message(20_000)) for _ in range(40)]
    first.close()
    path = tmp_path / FILE_NAME
    if damage == "truncated":
        with path.open("r+b") as file:
            file.truncate(100_000)
    else:
        path.write_bytes(b"not a database at all" * 100)
    spool = Spool(tmp_path, 10**7)
    assert spool.messages == 0 and spool.append(message()) > max(old)
    spool.close()
    (aside,) = tmp_path.glob(f"{FILE_NAME}.damaged-*")
    assert aside.stat().st_size in (100_000, len(b"not a database at all") * 100)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "edge.spool"]
    assert f"spool {path} is damaged" in line and "started empty" in line and ".recover" in line


def test_the_header_carries_the_seq_it_is_stored_under_and_resends_are_identical(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 10**6)
    seq = spool.append(message(50))
    stored = spool.get(seq)
    header, payload = decode(stored)
    assert header.seq == seq and payload == JPEG_START + b"x" * 47
    assert stored == message(50)(seq)
    assert spool.after(0, 10) == [(seq, stored)]
    spool.close()


def test_a_mark_is_stored_with_its_message_and_survives_reopening(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 10**6)
    assert spool.mark("footage:cars") is None
    first = spool.append(message(), mark=("footage:cars", 1))
    spool.close()

    reopened = Spool(tmp_path, 10**6)
    assert reopened.mark("footage:cars") == 1 and reopened.get(first) is not None
    assert reopened.append(message(), mark=("footage:cars", 2)) == first + 1  # marks leave the seqs alone
    assert reopened.ack([first, first + 1]) == 2 and reopened.mark("footage:cars") == 2  # acks leave the mark
    reopened.unmark("footage:cars")
    assert reopened.mark("footage:cars") is None and reopened.last_seq == first + 1
    reopened.close()


def test_after_and_ack_in_seq_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 10**6)
    seqs = [spool.append(message()) for _ in range(6)]
    assert [s for s, _ in spool.after(seqs[1], 3)] == seqs[2:5]
    assert spool.ack([seqs[0], seqs[3], 123]) == 2  # an unknown (already acked) seq is fine
    assert [s for s, _ in spool.after(0, 100)] == [seqs[1], seqs[2], seqs[4], seqs[5]]
    assert spool.get(seqs[0]) is None
    assert spool.messages == 4
    spool.close()


def test_an_emptied_spool_gives_its_free_pages_back_to_the_disk(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A backlog from an outage grew the file to its peak, and it stayed that size once every message was acked."""
    spool = Spool(tmp_path, 10**9)
    seqs = [spool.append(message(2**20), mark=("footage", n)) for n in range(40)]
    size = (tmp_path / FILE_NAME).stat().st_size + (tmp_path / (FILE_NAME + "-wal")).stat().st_size
    assert size > 40 * 2**20
    spool.ack(seqs[:39])  # one left: its pages and the free ones stay, for the next appends to reuse
    assert sum(f.stat().st_size for f in tmp_path.glob(FILE_NAME + "*")) > 39 * 2**20
    with caplog.at_level("INFO", logger="edge.spool"):
        assert spool.ack(seqs[39:]) == 1
    assert sum(f.stat().st_size for f in tmp_path.glob(FILE_NAME + "*")) < 2**20
    assert "emptied, gave" in caplog.text
    assert spool.mark("footage") == 39  # marks and the next seq are kept
    next_seq = spool.append(message())
    assert next_seq == seqs[-1] + 1
    spool.close()
    reopened = Spool(tmp_path, 10**9)
    assert (reopened.messages, reopened.last_seq, reopened.mark("footage")) == (1, next_seq, 39)
    reopened.close()


def test_over_the_byte_bound_the_oldest_are_dropped_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    one = sum(len(frame) for frame in message(1000)(10**15))  # as many digits as the seqs
    spool = Spool(tmp_path, max_bytes=5 * one)
    seqs = [spool.append(message(1000)) for _ in range(5)]
    assert spool.dropped == 0 and spool.bytes == 5 * one
    with caplog.at_level("WARNING", logger="edge.spool"):
        seqs += [spool.append(message(1000)) for _ in range(3)]
    assert spool.dropped == 3 and spool.messages == 5 and spool.bytes <= spool.max_bytes
    assert [s for s, _ in spool.after(0, 100)] == seqs[3:]
    # A big message drops as many old ones as it needs.
    with caplog.at_level("WARNING", logger="edge.spool"):
        spool.append(message(3500))
        assert spool.bytes <= spool.max_bytes and spool.dropped == 7
        spool.close()
    warnings = [r.getMessage() for r in caplog.records if r.name == "edge.spool"]
    assert len(warnings) == 2  # the first drop at once; the rest, not flooding the log, by close at the latest
    assert "dropped the 1 oldest" in warnings[0] and "1 dropped so far" in warnings[0]
    assert "dropped the 6 oldest" in warnings[1] and "7 dropped so far" in warnings[1]
    reopened = Spool(tmp_path, max_bytes=5 * one)
    assert (reopened.messages, reopened.bytes) == (spool.messages, spool.bytes)
    reopened.close()


def test_messages_appended_with_keep_are_dropped_only_when_no_other_is_left(tmp_path: Path) -> None:
    one = sum(len(frame) for frame in message(1000)(10**15))
    spool = Spool(tmp_path, max_bytes=4 * one)
    kept = spool.append(message(1000), keep=True)  # an event: the oldest message, yet not the first to go
    frames = [spool.append(message(1000)) for _ in range(3)]
    kept_too = spool.append(message(1000), keep=True)
    assert spool.dropped == 1 and [s for s, _ in spool.after(0, 100)] == [kept, *frames[1:], kept_too]
    for _ in range(3):  # only kept ones are left to drop: the oldest of them go
        spool.append(message(1000), keep=True)
    assert spool.dropped == 4 and kept not in [s for s, _ in spool.after(0, 100)]  # f2, f3, then the oldest kept
    assert spool.messages == 4 and spool.bytes <= spool.max_bytes
    spool.close()


def test_a_spool_file_from_before_keep_is_upgraded_with_its_messages(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / FILE_NAME)
    db.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);"
        "CREATE TABLE messages (seq INTEGER PRIMARY KEY, size INTEGER NOT NULL, frames BLOB NOT NULL);"
        "INSERT INTO meta VALUES ('next_seq', 8);"
    )
    packed = (3).to_bytes(4, "big") + b"abc"  # one frame as the spool packs messages: length, then bytes
    db.execute("INSERT INTO messages VALUES (7, 3, ?)", (packed,))
    db.commit()
    db.close()
    spool = Spool(tmp_path, max_bytes=10**6)
    assert (spool.messages, spool.last_seq) == (1, 7) and spool.get(7) == [b"abc"]
    assert spool.append(message(10), keep=True) == 8
    spool.close()


def test_bad_bound_and_unusable_folder_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(FilterForwardError, match="max_bytes"):
        Spool(tmp_path, 0)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(FilterForwardError, match="cannot open the spool"):
        Spool(blocker, 100)


WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from common.protocol import JPEG_START, FrameHeader, encode
    from edge.spool import Spool

    def build(seq):
        header = FrameHeader(edge="e1", run="r1", seq=seq, camera="c", frame=0, timestamp=0, wall_time=1, scores={})
        return encode(header, JPEG_START + b"x" * 1997)

    spool = Spool(Path(sys.argv[1]), 10**9)
    while True:
        seq = spool.append(build)
        print(seq, flush=True)  # only after the commit
    """
)


def test_a_process_killed_mid_appends_loses_nothing_it_committed(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[1]
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=repo
    )
    committed = [int(writer.stdout.readline()) for _ in range(300)]
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)
    committed += [int(line) for line in writer.stdout.read().split()]

    spool = Spool(tmp_path, 10**9)
    stored = [seq for seq, _ in spool.after(0, 10**6)]
    assert set(committed) <= set(stored)
    assert stored == list(range(stored[0], stored[0] + len(stored)))  # no holes, no torn message
    assert all(decode(spool.get(seq))[0].seq == seq for seq in stored[-5:])
    assert spool.append(message()) > stored[-1]
    spool.close()
    with sqlite3.connect(tmp_path / FILE_NAME) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
