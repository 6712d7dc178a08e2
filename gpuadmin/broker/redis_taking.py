"""Taking many messages of one queue off kombu's Redis transport at once, in kombu's own bookkeeping.

kombu's consumer takes a message per BRPOP, records it as taken with a second command and acknowledges
it with a third: at 1,000 snapshot updates a second that is a third of a core of central's
(``benchmarks/update_consumption.py``). ``RedisTaker.take`` runs one Lua script that pops up to N
messages and records each exactly as kombu records a message it delivers (``unacked``: the delivery tag
to ``[payload, exchange, routing key]``; ``unacked_index``: when), so kombu gives back the messages of a
worker that died as it gives back its own (``restore_visible``, after the visibility timeout);
``send_acks`` acknowledges all acknowledged since in one round trip; ``give_back`` puts those still
held back at the head of the queue, as kombu's channel does when it closes.

Only kombu's ``redis`` and ``sentinel`` transports, without ``global_keyprefix`` (``serves``).
The messages are kombu's (``TakenMessage``), decoded with the ``accept`` given: the broker is not
trusted to choose a serializer.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from typing import Any

from kombu.exceptions import MessageStateError
from kombu.serialization import prepare_accept_content
from kombu.transport.virtual.base import Message as VirtualMessage

logger = logging.getLogger(__name__)

# KEYS: kombu's unacked hash and index, then the queue's lists, highest priority first (kombu's order).
# ARGV: how many at most, the time to index them by. kombu's consumer pops from the right (BRPOP): so
# does this. A message kombu could not have delivered either (not JSON, no delivery tag) is returned
# without a record, for the caller to drop. One RPOP per message, not RPOP's count (Redis 6.2): any
# Redis that kombu runs on runs this.
TAKE_SCRIPT = """
local taken = {}
local most = tonumber(ARGV[1])
for i = 3, #KEYS do
  while #taken < most do
    local item = redis.call('RPOP', KEYS[i])
    if not item then break end
    local ok, payload = pcall(cjson.decode, item)
    local properties = ok and type(payload) == 'table' and payload['properties']
    local tag = type(properties) == 'table' and properties['delivery_tag']
    local delivery = type(properties) == 'table' and properties['delivery_info']
    if type(tag) == 'string' and type(delivery) == 'table' then
      redis.call('ZADD', KEYS[2], ARGV[2], tag)
      redis.call('HSET', KEYS[1], tag, '[' .. item .. ',' .. cjson.encode(delivery['exchange']) .. ','
                 .. cjson.encode(delivery['routing_key']) .. ']')
    end
    taken[#taken + 1] = item
  end
end
return taken
"""


class TakenMessage(VirtualMessage):
    """A kombu message taken by ``RedisTaker``: ``ack()`` marks it, its taker sends the marks at once."""

    def __init__(self, payload: dict[str, Any], *, taker: RedisTaker, **kwargs: Any) -> None:
        super().__init__(payload, channel=taker.channel, accept=taker.accept, **kwargs)
        tag = self.delivery_tag
        if not isinstance(tag, str):  # the script records only these
            raise TypeError(f"its delivery tag is not a string: {tag!r}")
        self.tag: str = tag
        self._taker = taker

    def ack(self, multiple: bool = False) -> None:
        if self.acknowledged:
            raise MessageStateError("Message already acknowledged")
        self._taker.acked.append(self.tag)
        self._state = "ACK"


class RedisTaker:
    """Takes messages of ``queue`` through ``channel`` (a kombu Redis channel of its own)."""

    def __init__(self, channel: Any, queue: str, *, accept: Iterable[str] = ("json",)) -> None:
        self.channel, self.queue = channel, queue
        self.accept = prepare_accept_content(list(accept))
        self.acked: list[str] = []  # acknowledged, not yet sent
        self.held: dict[str, None] = {}  # taken and not acknowledged, by delivery tag, oldest first
        self._keys = [channel.unacked_key, channel.unacked_index_key,
                      *dict.fromkeys(channel._q_for_pri(queue, step) for step in channel.priority_steps)]
        with channel.conn_or_acquire() as client:
            self._script = client.register_script(TAKE_SCRIPT)

    @staticmethod
    def serves(channel: Any) -> bool:
        """Whether ``channel`` is kombu's Redis (or Sentinel) transport's, keys unprefixed."""
        return (getattr(channel.connection, "driver_type", None) == "redis"
                and not getattr(channel, "global_keyprefix", ""))

    def take(self, most: int) -> list[TakenMessage]:
        """Up to ``most`` messages, oldest first, each recorded as taken before this returns."""
        with self.channel.conn_or_acquire() as client:
            items = self._script(keys=self._keys, args=[most, time.time()], client=client)
        messages = []
        for item in items:
            payload: Any = None
            try:
                payload = json.loads(item)
                message = TakenMessage(payload, taker=self)
            except Exception as error:  # what kombu's consumer could not have read either
                tag = _delivery_tag(payload)
                if tag is not None:  # recorded by the script: done with
                    self.acked.append(tag)
                logger.error("dropped a message of %s that is not kombu's: %s", self.queue, str(error)[:200])
                continue
            self.held[message.tag] = None
            messages.append(message)
        return messages

    def send_acks(self) -> None:
        """Acknowledge, in one round trip, every message acknowledged since the last call."""
        if not self.acked:
            return
        tags, self.acked = self.acked, []
        with self.channel.conn_or_acquire() as client:
            client.pipeline(transaction=False).zrem(self.channel.unacked_index_key, *tags).hdel(
                self.channel.unacked_key, *tags).execute()
        for tag in tags:
            self.held.pop(tag, None)

    def give_back(self) -> int:
        """Acknowledge what was acknowledged, then put every message still held back at the head of its
        queue, oldest nearest the head (kombu's own restore, one message at a time): how many."""
        self.send_acks()
        tags, self.held = list(self.held), {}
        for tag in reversed(tags):
            self.channel.qos.restore_by_tag(tag)
        return len(tags)


def _delivery_tag(payload: Any) -> str | None:
    try:
        tag = payload["properties"]["delivery_tag"]
    except (KeyError, TypeError):
        return None
    return tag if isinstance(tag, str) else None
