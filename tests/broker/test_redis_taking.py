"""Taking many messages off a real redis-server at once (gpuadmin/broker/redis_taking.py): recorded as
kombu records what its consumer delivers, so kombu's own restore gives them back; acknowledged many at
once; given back in order; what kombu could not read dropped."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection
from kombu.exceptions import ContentDisallowed, MessageStateError

from gpuadmin.broker.redis_taking import RedisTaker
from gpuadmin.celery import app
from tests.services import RedisServer

pytestmark = pytest.mark.services

QUEUE = "test.taking"


@pytest.fixture
def connection(redis_server: RedisServer) -> Iterator[Connection]:
    with Connection(redis_server.url) as connection:
        client = redis.Redis.from_url(redis_server.url)
        # The session's redis-server: earlier tests' bookkeeping is not this test's.
        client.delete(QUEUE, f"{QUEUE}\x06\x169", "unacked", "unacked_index")
        yield connection


@pytest.fixture
def client(redis_server: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(redis_server.url)


def send(connection: Connection, n: int, **options: Any) -> None:
    app.send_task("tests.taking", args=[{"n": n}], queue=QUEUE, connection=connection, **options)


def numbers(messages: list[Any]) -> list[int]:
    return [message.decode()[0][0]["n"] for message in messages]


def test_taken_messages_are_recorded_as_kombu_records_them_and_acknowledged_together(
    connection: Connection, client: redis.Redis
) -> None:
    for n in range(5):
        send(connection, n)
    queued = [json.loads(item) for item in reversed(client.lrange(QUEUE, 0, -1))]  # oldest first
    taker = RedisTaker(connection.channel(), QUEUE)

    taken = taker.take(3)
    assert numbers(taken) == [0, 1, 2] and client.llen(QUEUE) == 2
    entries = {tag.decode(): json.loads(entry) for tag, entry in client.hgetall("unacked").items()}
    assert entries == {m["properties"]["delivery_tag"]: [m, "", QUEUE] for m in queued[:3]}
    assert sorted(client.zrange("unacked_index", 0, -1)) == sorted(t.encode() for t in entries)
    assert list(taker.held) == [m.tag for m in taken]

    taken[0].ack()
    taken[2].ack()
    with pytest.raises(MessageStateError):
        taken[2].ack()
    assert client.hlen("unacked") == 3  # marked, not sent yet
    taker.send_acks()
    assert [tag.decode() for tag in client.hkeys("unacked")] == [taken[1].tag]
    assert client.zrange("unacked_index", 0, -1) == [taken[1].tag.encode()]
    assert list(taker.held) == [taken[1].tag] and taker.acked == []


def test_what_a_taker_that_died_held_is_given_back_by_kombus_own_restore(
    redis_server: RedisServer, connection: Connection, client: redis.Redis
) -> None:
    for n in range(2):
        send(connection, n)
    RedisTaker(connection.channel(), QUEUE).take(2)  # and never acknowledged: its worker died
    assert client.llen(QUEUE) == 0 and client.hlen("unacked") == 2

    with Connection(redis_server.url, transport_options={"visibility_timeout": 0.1}) as other:
        time.sleep(0.2)
        other.channel().qos.restore_visible(num=10, interval=1)
        again = RedisTaker(other.channel(), QUEUE).take(5)
    assert sorted(numbers(again)) == [0, 1]
    assert all(message.headers["redelivered"] for message in again)


def test_what_is_held_is_given_back_at_the_head_of_the_queue_in_order(
    connection: Connection, client: redis.Redis
) -> None:
    for n in range(4):
        send(connection, n)
    taker = RedisTaker(connection.channel(), QUEUE)
    taken = taker.take(3)
    taken[1].ack()
    assert taker.give_back() == 2
    assert client.hlen("unacked") == 0 and client.zcard("unacked_index") == 0
    assert numbers(RedisTaker(connection.channel(), QUEUE).take(5)) == [0, 2, 3]


def test_every_list_of_the_queue_is_taken_highest_priority_first(
    connection: Connection, client: redis.Redis
) -> None:
    send(connection, 0, priority=9)
    send(connection, 1)
    assert client.llen(QUEUE) == 1  # the other waits in the queue's list for its priority
    assert numbers(RedisTaker(connection.channel(), QUEUE).take(5)) == [1, 0]
    assert client.hlen("unacked") == 2


def test_what_kombu_could_not_read_is_dropped_and_a_serializer_it_does_not_accept_refused(
    connection: Connection, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    send(connection, 0)
    client.lpush(QUEUE, "not json")
    client.lpush(QUEUE, json.dumps({"properties": {"delivery_tag": 7, "delivery_info": {}}}))
    client.lpush(QUEUE, json.dumps({"properties": {"delivery_tag": "no-body-encoding",
                                                   "body_encoding": "rot13", "delivery_info": {}},
                                    "body": "x"}))
    app.send_task("tests.taking", args=[{"n": 1}], queue=QUEUE, connection=connection, serializer="pickle")
    taker = RedisTaker(connection.channel(), QUEUE)

    with caplog.at_level(logging.ERROR, logger="gpuadmin.broker.redis_taking"):
        taken = taker.take(10)
    assert len(taken) == 2 and numbers(taken[:1]) == [0]
    assert caplog.text.count(f"dropped a message of {QUEUE} that is not kombu's") == 3
    with pytest.raises(ContentDisallowed):  # the broker does not choose the serializer
        taken[1].decode()
    # The one the script recorded and Python could not read is acknowledged with the next acks.
    assert taker.acked == ["no-body-encoding"]
    taker.send_acks()
    assert sorted(client.hkeys("unacked")) == sorted(m.tag.encode() for m in taken)


def test_only_kombus_redis_transport_without_a_key_prefix_is_served(redis_server: RedisServer) -> None:
    with Connection(redis_server.url) as plain, Connection("memory://") as memory, \
            Connection(redis_server.url, transport_options={"global_keyprefix": "lab:"}) as prefixed:
        assert RedisTaker.serves(plain.channel())
        assert not RedisTaker.serves(memory.channel())
        assert not RedisTaker.serves(prefixed.channel())
