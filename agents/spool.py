"""A bounded on-disk spool for events the broker did not acknowledge.

When the broker is away, a node agent must neither block its sampling nor drop
what it sampled. Each failed flush becomes one segment file (JSON lines,
written to a temporary name, fsynced, then renamed, so a crash never leaves a
half segment). Segments drain oldest first once the broker answers again;
delivery is at least once (a segment that half-drained is sent whole again).
The spool is bounded: past ``max_bytes`` the oldest segments are dropped and
counted, so a long outage costs the oldest telemetry, never the node's disk.

Example::

    spool = DiskSpool(Path("var/spool"), max_bytes=256 * 1024**2)
    spool.append([SpooledRecord("telemetry.pdu.v1", b"pdu-1", b"{...}")])
    for segment in spool.segments():
        records = spool.load(segment)
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class SpooledRecord:
    """One unacknowledged message: its full topic name, key and value."""

    topic: str
    key: bytes | None
    value: bytes

    def to_line(self) -> str:
        key = None if self.key is None else base64.b64encode(self.key).decode()
        value = base64.b64encode(self.value).decode()
        return json.dumps({"topic": self.topic, "key": key, "value": value})

    @classmethod
    def from_line(cls, line: str) -> SpooledRecord:
        doc = json.loads(line)
        key = None if doc["key"] is None else base64.b64decode(doc["key"])
        return cls(doc["topic"], key, base64.b64decode(doc["value"]))


@dataclass(frozen=True, slots=True)
class AppendReport:
    segment: Path | None
    written: int
    dropped_records: int
    dropped_segments: int


class DiskSpool:
    """Segments of unacknowledged records under ``directory``, at most ``max_bytes``."""

    def __init__(self, directory: Path, *, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.directory = directory
        self.max_bytes = max_bytes
        directory.mkdir(parents=True, exist_ok=True)
        for leftover in directory.glob("*.tmp"):  # a crash mid-append: never acknowledged
            leftover.unlink()
        # This process is the spool's only writer: the disk is read once, then the
        # index (oldest first) and the byte count are kept here.
        found = sorted(directory.glob("*.jsonl"), key=lambda p: int(p.stem))
        self._sizes: dict[Path, int] = {p: p.stat().st_size for p in found}
        self._bytes = sum(self._sizes.values())
        self._next = int(found[-1].stem) + 1 if found else 1

    def segments(self) -> list[Path]:
        """Segment files, oldest first."""
        return list(self._sizes)

    def bytes_used(self) -> int:
        return self._bytes

    def records_in(self, segment: Path) -> int:
        with segment.open("rb") as handle:
            return sum(1 for _ in handle)

    def append(self, records: Sequence[SpooledRecord]) -> AppendReport:
        """Write ``records`` as one new segment; drop the oldest segments past the bound."""
        if not records:
            return AppendReport(None, 0, 0, 0)
        final = self.directory / f"{self._next:012d}.jsonl"
        self._next += 1
        tmp = final.with_suffix(".tmp")
        body = ("\n".join(r.to_line() for r in records) + "\n").encode()
        with tmp.open("wb") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.rename(final)
        self._sizes[final] = len(body)
        self._bytes += len(body)
        dropped_records = dropped_segments = 0
        while self._bytes > self.max_bytes and len(self._sizes) > 1:
            oldest = next(iter(self._sizes))
            dropped_records += self.records_in(oldest)
            dropped_segments += 1
            self.remove(oldest)
        return AppendReport(final, len(records), dropped_records, dropped_segments)

    def load(self, segment: Path) -> list[SpooledRecord]:
        return [SpooledRecord.from_line(line) for line in segment.read_text().splitlines() if line]

    def remove(self, segment: Path) -> None:
        segment.unlink(missing_ok=True)
        self._bytes -= self._sizes.pop(segment, 0)
