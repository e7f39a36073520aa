from pathlib import Path

import pytest

from agents.spool import DiskSpool, SpooledRecord


def _records(count: int, tag: str) -> list[SpooledRecord]:
    return [
        SpooledRecord("t.v1", None if i % 2 else f"k{i}".encode(), f"{tag}{i}".encode() * 10)
        for i in range(count)
    ]


def test_segments_round_trip_in_order_with_binary_keys_and_values(tmp_path: Path) -> None:
    spool = DiskSpool(tmp_path, max_bytes=1_000_000)
    first = [*_records(3, "a"), SpooledRecord("t.v1", b"\xff\x00", b"\x00\xfe raw")]
    spool.append(first)
    spool.append(_records(2, "b"))
    segments = spool.segments()
    assert [spool.load(s) for s in segments] == [first, _records(2, "b")]
    spool.remove(segments[0])
    assert [spool.load(s) for s in spool.segments()] == [_records(2, "b")]


def test_the_bound_drops_oldest_segments_and_counts_their_records(tmp_path: Path) -> None:
    spool = DiskSpool(tmp_path, max_bytes=2_500)
    reports = [spool.append(_records(10, str(i))) for i in range(6)]
    assert spool.bytes_used() <= 2_500
    dropped = sum(r.dropped_records for r in reports)
    kept = sum(len(spool.load(s)) for s in spool.segments())
    assert dropped + kept == 60 and dropped > 0
    assert spool.load(spool.segments()[-1]) == _records(10, "5")  # the newest survives


def test_a_restarted_agent_finds_its_segments_and_ignores_half_written_ones(
    tmp_path: Path,
) -> None:
    DiskSpool(tmp_path, max_bytes=1_000_000).append(_records(4, "x"))
    (tmp_path / "000000000009.tmp").write_text('{"topic": "t.v1", "ke')  # crash mid-append
    again = DiskSpool(tmp_path, max_bytes=1_000_000)
    assert [len(again.load(s)) for s in again.segments()] == [4]
    assert not list(tmp_path.glob("*.tmp"))
    again.append(_records(1, "y"))
    assert [s.name for s in again.segments()] == ["000000000001.jsonl", "000000000002.jsonl"]


def test_empty_appends_write_nothing_and_bad_bounds_are_refused(tmp_path: Path) -> None:
    spool = DiskSpool(tmp_path, max_bytes=10)
    assert spool.append([]).segment is None and spool.segments() == []
    with pytest.raises(ValueError, match="max_bytes"):
        DiskSpool(tmp_path, max_bytes=0)
