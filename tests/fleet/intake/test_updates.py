"""Snapshot updates in (gpuadmin/fleet/intake/updates.py): made by the real agent side
(gpuadmin/agent/snapshot_choice.py), signed by the host's test key, applied through central's one path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.db.models.sql.compiler import SQLCompiler
from django.test.utils import CaptureQueriesContext
from kombu import Connection

from gpuadmin.agent.snapshot_choice import Choice, Limits, choose
from gpuadmin.celery import app
from gpuadmin.fleet.intake.ingest import receive_snapshot
from gpuadmin.fleet.intake.updates import UpdateRefused, receive_snapshot_update
from gpuadmin.fleet.models import (
    Gpu,
    GpuSample,
    Host,
    HostSample,
    LatestSnapshot,
    ProcessLife,
    ProcessPoint,
    SnapshotRejection,
)
from gpuadmin.fleet.signals import snapshot_updates_storing
from gpuadmin.wire.signing import MessageKind, canonical_json, generate_private_key, seal, seal_text
from gpuadmin.wire.snapshot_update import build_update, overlay
from gpuadmin.wire.task_names import PROBE_HOST
from tests.factories import GiB, gpu, proc, snapshot
from tests.fleet.helpers import T0, at
from tests.keys import accept, host_key

pytestmark = pytest.mark.django_db

HOST = "gpu-upd"
G0, G1 = "GPU-sim-0000", "GPU-sim-0001"
MiB = 2**20
LIMITS = Limits(full_every_seconds=300, snapshot_max_bytes=8 * 2**20, update_max_bytes=256 * 1024,
                step_bytes=64 * MiB)


def document(seconds: float, *, big: int = 10 * GiB, small: int = 2 * GiB, used: tuple[int, int] = (11, 3),
             utilization: tuple[int, int] = (50, 20),
             extra: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The host at T0 + seconds: pid 101 holds ``big`` on GPU 0, pid 102 ``small`` on GPU 1."""
    return snapshot(HOST, taken_at=at(seconds), pids_in_use=400 + int(seconds), processes=[
        proc(101, gpu_memory={G0: big}, device_files=["/dev/nvidia0"], reasons=["gpu"]),
        proc(102, gpu_memory={G1: small}, device_files=["/dev/nvidia1"], reasons=["gpu"]),
        *(extra or []),
    ], gpus=[gpu(0, used=used[0] * GiB, utilization_percent=utilization[0]),
             gpu(1, used=used[1] * GiB, utilization_percent=utilization[1])])


class Agent:
    """The agent side of one host, its state in a temporary directory."""

    def __init__(self, state_path: Path) -> None:
        self.state_path = state_path

    def probe(self, doc: dict[str, Any], *, full: bool = False) -> Choice:
        return choose(doc, host_key(HOST), state_path=self.state_path, now=_unix(doc), limits=LIMITS,
                      full_requested=full)

    def send(self, doc: dict[str, Any], **kwargs: Any) -> Choice:
        """Probe and deliver what was chosen, as central's tasks do."""
        choice = self.probe(doc, **kwargs)
        received_at = at(_seconds(doc) + 0.5)
        if choice.kind is MessageKind.SNAPSHOT:
            receive_snapshot(choice.message, received_at=received_at)
        else:
            receive_snapshot_update(choice.message, received_at=received_at)
        return choice


def _unix(doc: dict[str, Any]) -> float:
    return T0.timestamp() + _seconds(doc)


def _seconds(doc: dict[str, Any]) -> float:
    from gpuadmin.fleet.taken_at import parse_taken_at

    return (parse_taken_at(doc["taken_at"]) - T0).total_seconds()


@pytest.fixture
def agent(tmp_path: Path) -> Agent:
    accept(HOST)
    agent = Agent(tmp_path / "state.json")
    assert agent.send(document(0)).kind is MessageKind.SNAPSHOT
    return agent


@pytest.fixture
def sent_probes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Probe requests central sends, as they reach the host's queue (an in-memory broker)."""
    original = app.send_task
    received: list[Any] = []
    with Connection("memory://") as connection:
        monkeypatch.setattr(app, "send_task", lambda *a, **kw: original(*a, connection=connection, **kw))
        yield received
        with connection.SimpleQueue(f"host.{HOST}") as queue:
            while queue.qsize():
                message = queue.get(timeout=1)
                message.ack()
                received.append(message)


def state() -> tuple[Any, ...]:
    """What an update may change, read back."""
    host = Host.objects.get(name=HOST)
    return (host.last_snapshot_taken_at, host.pids_in_use, LatestSnapshot.objects.document_for(host),
            sorted(Gpu.objects.filter(host=host).values_list(
                "uuid", "memory_used_bytes", "utilization_percent", "memory_attributed_bytes")),
            GpuSample.objects.count(), ProcessPoint.objects.count())


def refused(message: dict[str, Any], seconds: float = 30) -> UpdateRefused:
    with pytest.raises(UpdateRefused) as caught:
        receive_snapshot_update(message, received_at=at(seconds))
    return caught.value


def test_an_update_changes_the_latest_figures_exactly(agent: Agent) -> None:
    base = LatestSnapshot.objects.get()
    now = document(10, big=20 * GiB, small=2 * GiB + MiB, used=(21, 3), utilization=(90, 0))

    choice = agent.send(now)

    assert choice.kind is MessageKind.SNAPSHOT_UPDATE
    # Only the process that moved past the step is in it.
    assert [p["pid"] for p in choice.message_body()["processes"]] == [101]
    host = Host.objects.get(name=HOST)
    assert host.last_snapshot_taken_at == at(10) and host.pids_in_use == 410
    assert sorted(Gpu.objects.filter(host=host).values_list(
        "uuid", "memory_used_bytes", "utilization_percent", "memory_attributed_bytes")) == [
        (G0, 21 * GiB, 90, 20 * GiB), (G1, 3 * GiB, 0, 2 * GiB + MiB)]
    latest = LatestSnapshot.objects.get()
    assert latest.document == base.document and latest.update_sequence == 1  # the base is not rewritten
    shown = LatestSnapshot.objects.document_for(host)
    assert shown == overlay(base.document, choice.message_body())
    assert shown["taken_at"] == now["taken_at"]
    assert [g["memory_used_bytes"] for g in shown["gpus"]] == [21 * GiB, 3 * GiB]
    assert {p["pid"]: p["gpu_memory_bytes"] for p in shown["processes"]} == {101: {G0: 20 * GiB},
                                                                              102: {G1: 2 * GiB}}
    # History: a sample per GPU per message, a point where the memory moved past the step.
    samples = GpuSample.objects.filter(taken_at=at(10))
    figures = samples.values_list("memory_used_bytes", "utilization_percent")
    assert sorted(figures) == [(3 * GiB, 0), (21 * GiB, 90)]
    life = ProcessLife.objects.get(pid=101)
    assert (life.last_gpu_memory_bytes, life.peak_gpu_memory_bytes) == (20 * GiB, 20 * GiB)
    assert list(ProcessPoint.objects.filter(life=life).values_list("taken_at", "gpu_memory_bytes")) == [
        (at(0), 10 * GiB), (at(10), 20 * GiB)]
    assert ProcessPoint.objects.filter(life__pid=102).count() == 1


@pytest.mark.parametrize("full", [True, False], ids=["full-snapshots", "updates"])
def test_full_snapshots_and_updates_write_the_same_raw_samples(agent: Agent, settings, full: bool) -> None:
    """One rule (history/record.py's sample_due) whatever the kind: a GPU's or the host's raw sample is
    written when a figure moved past its step or the last written one is a minute old."""
    settings.GPUADMIN_HISTORY_RAW_SECONDS = 60
    for doc in (document(10),  # nothing moved (PIDs in use by 10: under their step)
                document(20, utilization=(65, 20)),  # GPU 0 past its step
                document(30, utilization=(60, 20)),  # under it, from the 20 s sample
                document(40, utilization=(65, 0)),  # GPU 1 idles
                document(60, utilization=(65, 0)),  # the host's heartbeat
                document(80, utilization=(65, 0))):  # GPU 0's
        kind = agent.send(doc, full=full).kind
        assert kind is (MessageKind.SNAPSHOT if full else MessageKind.SNAPSHOT_UPDATE)
    written = GpuSample.objects.values_list("gpu__uuid", "taken_at", "utilization_percent",
                                            "memory_attributed_bytes")
    assert sorted(written) == [
        (G0, at(0), 50, 10 * GiB), (G0, at(20), 65, 10 * GiB), (G0, at(80), 65, 10 * GiB),
        (G1, at(0), 20, 2 * GiB), (G1, at(40), 0, 2 * GiB)]
    assert sorted(HostSample.objects.values_list("taken_at", flat=True)) == [at(0), at(60)]


def test_an_update_naming_a_process_whose_memory_stayed_does_not_rewrite_its_life(agent: Agent) -> None:
    """An update names what moved since its base: the same figures, update after update."""
    assert agent.send(document(10, big=20 * GiB)).kind is MessageKind.SNAPSHOT_UPDATE
    with CaptureQueriesContext(connection) as queries:
        choice = agent.send(document(20, big=20 * GiB))
    assert [p["pid"] for p in choice.message_body()["processes"]] == [101]  # named again
    assert not [q for q in queries if "UPDATE fleet_processlife" in q["sql"]]
    life = ProcessLife.objects.get(pid=101)
    assert (life.last_gpu_memory_bytes, life.peak_gpu_memory_bytes, life.point_gpu_memory_bytes) == (
        20 * GiB, 20 * GiB, 20 * GiB)
    agent.send(document(30, big=21 * GiB))  # moved: written
    life.refresh_from_db()
    assert (life.last_gpu_memory_bytes, life.peak_gpu_memory_bytes) == (21 * GiB, 21 * GiB)


def test_an_update_compiles_no_queryset_once_warm(agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every statement an update runs is compiled once per process (fleet/storage/statements.py): the
    ORM's compiling was a third of an update's CPU where it was done per update (the ledger's holders)."""
    agent.send(document(10, big=20 * GiB))  # warm: each statement compiled once
    compiled: list[str] = []
    as_sql = SQLCompiler.as_sql

    def counting(self: SQLCompiler, *args: Any, **kwargs: Any) -> Any:
        compiled.append(self.query.model.__name__ if self.query.model else "")
        return as_sql(self, *args, **kwargs)

    monkeypatch.setattr(SQLCompiler, "as_sql", counting)
    assert agent.send(document(20, big=21 * GiB)).kind is MessageKind.SNAPSHOT_UPDATE
    assert compiled == []


def test_a_full_snapshot_after_updates_is_the_new_base(agent: Agent) -> None:
    agent.send(document(10, big=20 * GiB))
    changed = document(20, extra=[proc(103, gpu_memory={G0: GiB}, reasons=["gpu"])])

    assert agent.send(changed).kind is MessageKind.SNAPSHOT  # a new process: full

    latest = LatestSnapshot.objects.get()
    assert latest.update is None and latest.update_sequence == 0
    assert LatestSnapshot.objects.document_for(Host.objects.get(name=HOST)) == changed
    assert agent.send(document(30, extra=[proc(103, gpu_memory={G0: GiB}, reasons=["gpu"])])).kind \
        is MessageKind.SNAPSHOT_UPDATE
    assert LatestSnapshot.objects.get().update_sequence == 1


def test_an_update_of_an_unknown_base_is_refused_and_a_full_snapshot_asked_for(agent: Agent, sent_probes,
                                                                               django_capture_on_commit_callbacks):
    before = state()
    body = build_update(document(10), base="sha256:" + "0" * 64, sequence=1, base_memory={}, step_bytes=MiB)

    with django_capture_on_commit_callbacks(execute=True):
        first = refused(seal(body, MessageKind.SNAPSHOT_UPDATE, host_key(HOST)), 11)
        second = refused(seal({**body, "sequence": 2}, MessageKind.SNAPSHOT_UPDATE, host_key(HOST)), 12)

    assert "unknown base" in first.message and first.full_requested
    assert not second.full_requested  # asked once per probe interval, however many arrive
    assert state() == before
    assert Host.objects.get(name=HOST).full_snapshot_requested_at == at(11)
    rejection = SnapshotRejection.objects.get(error__contains="unknown base", host_name=HOST,
                                              received_at=at(11))
    assert rejection.message_kind == SnapshotRejection.MessageKind.SNAPSHOT_UPDATE
    # The request went to the host's queue, asking for a full snapshot.
    _ = sent_probes


def test_the_full_snapshot_request_reaches_the_hosts_queue(agent: Agent, monkeypatch,
                                                           django_capture_on_commit_callbacks) -> None:
    original = app.send_task
    body = build_update(document(10), base="sha256:" + "1" * 64, sequence=1, base_memory={}, step_bytes=1)
    with Connection("memory://") as connection:
        monkeypatch.setattr(app, "send_task", lambda *a, **kw: original(*a, connection=connection, **kw))
        with django_capture_on_commit_callbacks(execute=True):
            refused(seal(body, MessageKind.SNAPSHOT_UPDATE, host_key(HOST)), 11)
        with connection.SimpleQueue(f"host.{HOST}") as queue:
            message = queue.get(timeout=2)
            message.ack()
    assert message.headers["task"] == PROBE_HOST
    assert message.decode()[1] == {"full": True}
    # The agent answers with a full snapshot, whatever its state says.
    assert agent.probe(document(12), full=True).kind is MessageKind.SNAPSHOT


def test_an_update_after_a_gap_is_refused_and_a_full_snapshot_asked_for(agent: Agent) -> None:
    agent.probe(document(10, big=12 * GiB))  # update 1, lost on the way
    before = state()

    gap = refused(agent.probe(document(20, big=14 * GiB)).message, 21)

    assert "updates 1 to 1 of this base are missing" in gap.message and gap.full_requested
    assert state() == before


def test_a_replayed_or_reordered_update_is_refused(agent: Agent) -> None:
    one = agent.probe(document(10, big=12 * GiB))
    two = agent.probe(document(20, big=14 * GiB))
    receive_snapshot_update(one.message, received_at=at(10.5))
    receive_snapshot_update(two.message, received_at=at(20.5))
    after_two = state()

    replayed = refused(two.message, 25)
    reordered = refused(one.message, 26)

    assert "replayed or late" in replayed.message and not replayed.full_requested
    assert "replayed or late" in reordered.message and not reordered.full_requested
    assert state() == after_two


def test_an_update_not_newer_than_the_latest_snapshot_is_refused(agent: Agent) -> None:
    body = agent.probe(document(10)).message_body()
    stale = seal({**body, "taken_at": document(0)["taken_at"]}, MessageKind.SNAPSHOT_UPDATE, host_key(HOST))
    before = state()

    assert "not newer" in refused(stale).message
    assert state() == before


def test_a_forged_update_is_refused_and_counted_on_the_host(agent: Agent) -> None:
    body = agent.probe(document(10, big=30 * GiB)).message_body()
    before = state()

    forged = refused(seal(body, MessageKind.SNAPSHOT_UPDATE, generate_private_key()))
    good = seal(body, MessageKind.SNAPSHOT_UPDATE, host_key(HOST))
    text = good["text"].replace('"utilization_percent":50', '"utilization_percent":5')
    altered = refused({**good, "text": text})
    as_snapshot = refused(seal(body, MessageKind.SNAPSHOT, host_key(HOST)))

    assert "not by this host's accepted key" in forged.message
    assert "does not verify" in altered.message
    assert "where a 'snapshot_update' was expected" in as_snapshot.message
    assert state() == before
    assert Host.objects.get(name=HOST).rejected_message_count == 3


def test_an_oversized_update_is_refused_before_it_is_read(agent: Agent, settings) -> None:
    message = agent.probe(document(10, big=12 * GiB)).message
    settings.GPUADMIN_SNAPSHOT_UPDATE_MAX_BYTES = len(message["text"]) - 1
    before = state()

    assert "over the limit" in refused(message).message
    assert state() == before


def test_a_malformed_update_gets_a_clear_error_and_changes_nothing(agent: Agent) -> None:
    body = agent.probe(document(10)).message_body()
    spoiled = {**body, "gpus": [{**body["gpus"][0], "utilization_percent": 150}, body["gpus"][1]]}
    before = state()

    error = refused(seal_text(canonical_json(spoiled), MessageKind.SNAPSHOT_UPDATE, host_key(HOST)))

    assert "utilization_percent" in error.message and "<= 100" in error.message
    assert state() == before
    assert "utilization_percent" in Host.objects.get(name=HOST).last_error  # signed by its key: shown
    assert refused(seal_text("{not json", MessageKind.SNAPSHOT_UPDATE, host_key(HOST))).message.startswith(
        "a snapshot update is JSON")


def test_an_update_naming_a_gpu_the_base_lacks_asks_for_a_full_snapshot(agent: Agent) -> None:
    body = agent.probe(document(10)).message_body()
    odd = {**body, "gpus": [*body["gpus"], {**body["gpus"][0], "uuid": "GPU-sim-0009"}]}
    before = state()

    error = refused(seal(odd, MessageKind.SNAPSHOT_UPDATE, host_key(HOST)))

    assert "GPU-sim-0009" in error.message and error.full_requested
    assert state() == before


def test_an_applied_update_is_signalled_inside_its_transaction(agent: Agent) -> None:
    """``fleet.signals.snapshot_updates_storing``: what the usage ledger follows between full snapshots."""
    heard: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        heard.append(kwargs)

    snapshot_updates_storing.connect(receiver)
    try:
        agent.send(document(10, big=20 * GiB))
        with pytest.raises(UpdateRefused):  # refused: not heard
            receive_snapshot_update(agent.probe(document(20)).message, received_at=at(5))
    finally:
        snapshot_updates_storing.disconnect(receiver)

    [kwargs] = heard
    [(host, update, taken_at)] = kwargs["updates"]
    assert host.name == HOST and taken_at == at(10)
    assert [(p.pid, p.gpu_memory_bytes) for p in update.processes] == [(101, {G0: 20 * GiB})]


def test_the_current_process_rows_read_from_the_texts_are_those_of_the_current_document(agent: Agent) -> None:
    """``LatestSnapshot.objects.process_rows_by_host_id`` (what fair use reads of every host) against
    ``process_rows`` of the document as pages read it, before and after an update, ages moved on; and a
    stored text msgspec refuses read the document's way."""
    from gpuadmin.fleet.process_tree import process_rows
    from gpuadmin.fleet.storage.json_text import ValidatedJson

    host = Host.objects.get(name=HOST)

    def both() -> tuple[Any, Any]:
        by_texts = LatestSnapshot.objects.process_rows_by_host_id([host.pk])[host.pk]
        return by_texts, process_rows(LatestSnapshot.objects.document_for(host))

    by_texts, by_document = both()
    assert by_texts == by_document and by_texts[101].total_gpu_memory_bytes == 10 * GiB
    agent.send(document(10, big=20 * GiB))
    by_texts, by_document = both()
    assert by_texts == by_document
    moved = by_texts[101]
    assert moved.gpu_memory_bytes == {G0: 20 * GiB} and moved.total_gpu_memory_bytes == 20 * GiB
    assert moved.elapsed_seconds == round(document(0)["processes"][0]["elapsed_seconds"] + 10, 2)
    text = LatestSnapshot.objects.values_list("document", flat=True).get()
    spoiled = canonical_json(text).replace('"taken_at":', '"nan":NaN,"taken_at":', 1)
    LatestSnapshot.objects.update(document=ValidatedJson(spoiled))
    by_texts, by_document = both()
    assert by_texts == by_document and by_texts[101].gpu_memory_bytes == {G0: 20 * GiB}
