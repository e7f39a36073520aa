from aiokafka import TopicPartition

from streams.lag import lag_by_topic


def test_lag_sums_partitions_and_counts_uncommitted_ones_from_their_beginning() -> None:
    a0, a1, b0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)
    end = {a0: 100, a1: 50, b0: 30}
    committed = {a0: 90, a1: 50}
    beginning = {a0: 0, a1: 0, b0: 10}  # b was never committed; retention dropped 0..9
    assert lag_by_topic(end, committed, beginning) == {"a": 10, "b": 20}
    assert lag_by_topic({a0: 5}, {a0: 9}, {}) == {"a": 0}  # never negative
