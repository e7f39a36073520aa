import base64

from schemas.commands import DeadLetter
from schemas.topics import ACCELERATOR
from streams.ingest import MAX_DEAD_LETTER_RAW_BYTES, RawMessage, split
from streams.rows import Coordinates
from tests.factories import START, fleet_events, malformed_payloads


def test_split_keeps_valid_and_turns_bad_into_dead_letters_with_coordinates() -> None:
    good = [v for s, v in fleet_events(200) if s is ACCELERATOR][:5]
    bad = [raw for spec, raw, _ in malformed_payloads(20) if spec is ACCELERATOR]
    messages = [
        RawMessage(Coordinates("t", 2, i), b"node-1", v.model_dump_json().encode())
        for i, v in enumerate(good)
    ] + [RawMessage(Coordinates("t", 2, 100 + i), b"node-1", raw) for i, raw in enumerate(bad)]
    out = split(messages, ACCELERATOR.value_type, now=START)
    assert [v for v, _ in out.valid] == good
    assert len(out.dead) == len(bad)
    for (letter, at), raw in zip(out.dead, bad, strict=True):
        assert isinstance(letter, DeadLetter)
        assert (letter.source_topic, letter.source_partition) == ("t", 2)
        assert letter.source_offset == at.offset
        assert base64.b64decode(letter.raw_base64) == raw
        assert letter.source_key == "node-1"
        assert letter.error


def test_split_of_nothing_is_empty() -> None:
    out = split([], ACCELERATOR.value_type, now=START)
    assert out.valid == [] and out.dead == []


def test_huge_bad_messages_keep_a_bounded_prefix_and_their_size() -> None:
    raw = b"{" + b"x" * 900_000
    out = split(
        [RawMessage(Coordinates("t", 0, 7), b"k" * 5000, raw)], ACCELERATOR.value_type, now=START
    )
    ((letter, _),) = out.dead
    assert letter.raw_size_bytes == len(raw)
    assert base64.b64decode(letter.raw_base64) == raw[:MAX_DEAD_LETTER_RAW_BYTES]
    assert len(letter.model_dump_json()) < 200_000  # always fits a Kafka message
    assert letter.source_key is not None and len(letter.source_key) == 1024
