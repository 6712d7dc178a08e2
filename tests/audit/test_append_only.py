"""Nobody changes or removes an audit event: not the model, not a queryset, not SQL on PostgreSQL.

The one change allowed is clearing the actor when that user is deleted.
"""

from __future__ import annotations

import threading

import pytest
from django.db import DatabaseError, connection, connections, transaction

from gpuadmin.audit import log
from gpuadmin.audit.models import Action, AppendOnlyError, AuditEvent
from tests.audit.helpers import audit_table, postgres_only

pytestmark = pytest.mark.django_db


def test_saving_an_existing_event_is_refused(record_events):
    (event,) = record_events(1)
    event.host_name = "elsewhere"
    with pytest.raises(AppendOnlyError, match="cannot be changed"):
        event.save()
    assert AuditEvent.objects.get().host_name == "gpu1"


def test_an_event_not_written_by_record_is_refused():
    with pytest.raises(AppendOnlyError, match=r"log\.record"):
        AuditEvent.objects.create(sequence=1, action=Action.REQUESTED, previous_hash="0" * 64, hash="f" * 64)
    assert not AuditEvent.objects.exists()


def test_deleting_an_event_is_refused(record_events):
    (event,) = record_events(1)
    with pytest.raises(AppendOnlyError, match="cannot be deleted"):
        event.delete()
    assert AuditEvent.objects.count() == 1


def test_queryset_update_and_delete_are_refused(record_events):
    record_events(2)
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.update(host_name="elsewhere")
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.filter(sequence=1).update(actor_name="mallory", actor=None)
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.all().delete()
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.bulk_create([AuditEvent(sequence=9)])
    assert list(AuditEvent.objects.values_list("host_name", flat=True)) == ["gpu1", "gpu1"]
    assert AuditEvent.objects.verify().ok


def test_deleting_a_user_keeps_their_events_and_the_chain(make_user):
    alice = make_user("alice")
    bob = make_user("bob")
    log.record(Action.REQUESTED, actor=alice, kill_request_id=1, requester_name="alice")
    log.record(Action.APPROVED, actor=bob, kill_request_id=1, requester_name="alice", approver_name="bob")
    log.record(Action.FINISHED, kill_request_id=1)

    alice.delete()

    events = list(AuditEvent.objects.all())
    assert [(e.actor_id, e.actor_name) for e in events] == [(None, "alice"), (bob.pk, "bob"), (None, "")]
    assert AuditEvent.objects.verify().ok


def test_the_admin_shows_events_but_cannot_add_change_or_delete(client, django_user_model, record_events):
    (event,) = record_events(1)
    client.force_login(django_user_model.objects.create_superuser("root", password="x"))

    assert client.get("/admin/audit/auditevent/").status_code == 200
    assert client.get(f"/admin/audit/auditevent/{event.pk}/change/").status_code == 200  # read-only view
    assert client.get("/admin/audit/auditevent/add/").status_code == 403
    assert client.post(f"/admin/audit/auditevent/{event.pk}/delete/", {"post": "yes"}).status_code == 403
    assert AuditEvent.objects.count() == 1


def test_system_and_anonymous_actors_are_recorded_without_a_name():
    from django.contrib.auth.models import AnonymousUser

    event = log.record(Action.EXPIRED, actor=AnonymousUser(), kill_request_id=3)
    assert (event.actor_id, event.actor_name) == (None, "")


# --- PostgreSQL: the triggers ---------------------------------------------------


def _sql(statement: str, params: tuple = ()) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        # Run the deferred foreign-key checks of the rows this test inserted, or
        # PostgreSQL refuses TRUNCATE for them before the trigger is asked.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(statement, params)


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE {table} SET host_name = 'elsewhere' WHERE sequence = 1",
        "UPDATE {table} SET actor_id = NULL, actor_name = 'mallory' WHERE sequence = 1",
        "UPDATE {table} SET actor_id = actor_id WHERE sequence = 1",
        "DELETE FROM {table} WHERE sequence = 2",
        "TRUNCATE {table}",
    ],
    ids=["update", "update-with-actor-cleared", "update-actor-kept", "delete", "truncate"],
)
@postgres_only
def test_sql_that_changes_or_removes_events_is_refused_by_triggers(statement, record_events, make_user):
    record_events(2, actor=make_user("alice"))

    with pytest.raises(DatabaseError, match=r"audit events are append-only: (UPDATE|DELETE|TRUNCATE)"):
        _sql(statement.format(table=audit_table()))

    assert list(AuditEvent.objects.values_list("host_name", "actor_name")) == [("gpu1", "alice")] * 2
    assert AuditEvent.objects.verify().ok


@postgres_only
def test_the_trigger_lets_clearing_the_actor_through(make_user):
    alice = make_user("alice")
    log.record(Action.REQUESTED, actor=alice, kill_request_id=1)

    _sql(f"UPDATE {audit_table()} SET actor_id = NULL WHERE actor_id = %s", (alice.pk,))
    alice.delete()  # and Django's own SET_NULL path, through the same trigger

    assert list(AuditEvent.objects.values_list("actor_id", "actor_name")) == [(None, "alice")]
    assert AuditEvent.objects.verify().ok


@postgres_only
# serialized_rollback: the flush at the end must give later tests back the roles and
# content types that migrations made (and that other serialized tests expect).
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_concurrent_appends_from_two_connections_make_one_gapless_chain():
    rounds = 15
    both_inside = threading.Barrier(2, timeout=30)
    errors: list[BaseException] = []

    def writer(name: str) -> None:
        try:
            for i in range(rounds):
                with transaction.atomic():
                    # Each transaction has already read the table (as a real
                    # caller would have) when both try to append at once.
                    AuditEvent.objects.count()
                    both_inside.wait()
                    log.record(Action.SIGNAL_SENT, host_name=name, details={"round": i})
        except BaseException as error:
            errors.append(error)
            both_inside.abort()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer, args=(name,)) for name in ("gpu-a", "gpu-b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert list(AuditEvent.objects.values_list("sequence", flat=True)) == list(range(1, 2 * rounds + 1))
    assert AuditEvent.objects.filter(host_name="gpu-a").count() == rounds
    result = AuditEvent.objects.verify()
    assert (result.ok, result.events) == (True, 2 * rounds)
