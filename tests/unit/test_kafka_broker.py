from fleetloop.kafka_broker import new_cluster_id


def test_cluster_ids_are_22_base64url_chars_and_never_look_like_an_option() -> None:
    ids = [new_cluster_id() for _ in range(5000)]  # about 78 would start with '-' by chance
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
    assert len(set(ids)) == len(ids)
    alphabet = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert set("".join(ids)) <= alphabet
