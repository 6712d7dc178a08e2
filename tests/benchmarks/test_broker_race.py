"""benchmarks/broker_race.py's verdict: the stock transport's failures are what it reports, the embedded
broker's fail it.

Real publishers (child processes, forked: they inherit a patch made here), real folders, a few messages.
A transport is broken by patching its Channel in this process, as kombu's race breaks the stock one.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kombu.transport import filesystem as stock

from benchmarks import broker_race
from gpuadmin.broker import filesystem as embedded

MESSAGES = 3  # per publisher


def torn_table(*_args: Any, **_kwargs: Any) -> None:
    # What a declare gets when it reads an exchange table another process has created but not yet written.
    json.loads("")


def raises_once(original: Any) -> Any:
    raised: list[bool] = []

    def _get(self: Any, queue: str, *args: Any, **kwargs: Any) -> Any:
        if not raised:
            raised.append(True)
            raise OSError("broken on purpose")  # then it delivers every message: an error, nothing lost
        return original(self, queue, *args, **kwargs)
    return _get


def drops_every_other(original: Any) -> Any:
    def _get(self: Any, queue: str, *args: Any, **kwargs: Any) -> Any:
        original(self, queue, *args, **kwargs)  # claimed, never delivered: lost without an error
        return original(self, queue, *args, **kwargs)
    return _get


def test_a_healthy_run_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert broker_race.compare(("stock", "embedded"), MESSAGES) == 0
    assert "embedded  received 6 of 6 (0 lost), 0 duplicated, 0 errors raised" in capsys.readouterr().out


def test_the_stock_transports_crash_is_counted_not_raised(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(stock.Channel, "_queue_bind", torn_table)
    assert broker_race.compare(("stock", "embedded"), MESSAGES) == 0
    out = capsys.readouterr().out
    # Every process failed to declare: nothing was sent, the consumer gave up, each counted once.
    assert "stock     received 0 of 6 (6 lost), 0 duplicated, 3 errors raised" in out, out
    assert "consumer: JSONDecodeError 1, publisher: JSONDecodeError 2" in out, out


@pytest.mark.parametrize(("method", "broken"), [
    ("_queue_bind", torn_table),  # the consumer cannot declare its queue
    ("_get", raises_once(embedded.Channel._get)),
    ("_get", drops_every_other(embedded.Channel._get)),
], ids=["declare-raises", "get-raises-once", "get-loses"])
def test_a_failing_embedded_broker_fails_the_comparison(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str],
                                                        method: str, broken: Any) -> None:
    monkeypatch.setattr(embedded.Channel, method, broken)
    assert broker_race.compare(("stock", "embedded"), MESSAGES) == 1
    embedded_line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("embedded"))
    assert "received 6 of 6 (0 lost), 0 duplicated, 0 errors" not in embedded_line
