"""Host keys and enrolment (gpuadmin/fleet/intake/trust.py) and what central does with what arrives.

A host's first signed snapshot only offers its key; once an approver accepted
it, only what that key signed counts; everything else is a rejected message:
nothing changes, it is counted, shown (a finding) and audited.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from gpuadmin.audit.models import Action, AuditEvent
from gpuadmin.fleet.intake import trust
from gpuadmin.fleet.intake.ingest import receive_snapshot
from gpuadmin.fleet.intake.validation import SnapshotRejected
from gpuadmin.fleet.models import Finding, Host, LatestSnapshot, SnapshotRejection
from gpuadmin.wire.signing import compress_envelope, fingerprint, generate_private_key, public_key_text
from tests.factories import proc, snapshot
from tests.keys import accept, host_key, signed_snapshot

pytestmark = pytest.mark.django_db
OTHER_KEY = "not by this host's accepted key"


def audit_actions() -> list[str]:
    return list(AuditEvent.objects.order_by("sequence").values_list("action", flat=True))


def rejected(message: object) -> SnapshotRejected:
    with pytest.raises(SnapshotRejected) as error:
        receive_snapshot(message)
    return error.value


def test_the_first_signed_snapshot_of_an_unknown_host_only_offers_its_key() -> None:
    assert receive_snapshot(signed_snapshot(snapshot("newbox", processes=[proc(10)]))) is None
    host = Host.objects.get(name="newbox")
    assert host.awaiting_acceptance and host.key_fingerprint == fingerprint(host_key("newbox"))
    assert not LatestSnapshot.objects.exists() and host.process_count == 0
    assert list(Host.objects.awaiting_acceptance()) == [host]
    assert list(Host.objects.for_listing()) == []  # nothing of it is fleet data
    assert audit_actions() == ["host_key_offered"]
    # Asking again changes nothing and logs nothing more.
    assert receive_snapshot(signed_snapshot(snapshot("newbox"))) is None
    assert audit_actions() == ["host_key_offered"]


def test_an_accepted_host_s_snapshots_are_stored(approver) -> None:
    receive_snapshot(signed_snapshot(snapshot("newbox")))
    with pytest.raises(trust.KeyMismatch):
        trust.accept_host("newbox", actor=approver, expected_fingerprint="SHA256:not-it")
    trust.accept_host("newbox", actor=approver, expected_fingerprint=fingerprint(host_key("newbox")))
    host = receive_snapshot(signed_snapshot(snapshot("newbox", processes=[proc(10)])))
    assert host is not None and host.latest_snapshot.document["processes"][0]["pid"] == 10
    accepted = AuditEvent.objects.get(action="host_accepted")
    assert accepted.actor_name == approver.username
    assert accepted.details["fingerprint"] == host.key_fingerprint


@pytest.mark.parametrize(("message", "why"), [
    (lambda: json.dumps(snapshot("gpu01")), "not signed"),
    (lambda: signed_snapshot(snapshot("gpu01"), key=generate_private_key()), OTHER_KEY),
    (lambda: signed_snapshot(snapshot("gpu01"), key=host_key("gpu02")), OTHER_KEY),
    # Compressed as agents send them: the name claimed inside is read all the same.
    (lambda: compress_envelope({**signed_snapshot(snapshot("gpu01")),
                                "sig": signed_snapshot(snapshot("gpu02"))["sig"]}), "not signed"),
    (lambda: compress_envelope(signed_snapshot(snapshot("gpu01"), key=host_key("gpu02"))), OTHER_KEY),
])
def test_a_snapshot_not_signed_by_the_host_s_key_changes_nothing_and_is_counted_shown_and_audited(
    message, why
) -> None:
    accept("gpu01")
    accept("gpu02")  # a compromised host can lie about itself, never about another
    receive_snapshot(signed_snapshot(snapshot("gpu01", processes=[proc(10)])))
    before = LatestSnapshot.objects.get(host__name="gpu01").document

    assert why in rejected(message()).message

    host = Host.objects.get(name="gpu01")
    assert LatestSnapshot.objects.get(host=host).document == before
    assert host.rejected_message_count == 1 and why in host.last_rejected_message_reason
    assert host.last_error == ""  # the page's error is the host's own business
    finding = host.findings.open().get(kind=Finding.Kind.REJECTED_MESSAGES)
    assert finding.details["count"] == 1
    event = AuditEvent.objects.get(action="message_rejected")
    assert event.host_name == "gpu01" and why in event.details["reason"]
    assert SnapshotRejection.objects.get().message_kind == "snapshot"


def test_a_flood_of_rejected_messages_is_counted_but_audited_once_a_minute() -> None:
    accept("gpu01")
    for _ in range(5):
        rejected(json.dumps(snapshot("gpu01")))
    assert Host.objects.get(name="gpu01").rejected_message_count == 5
    assert AuditEvent.objects.filter(action="message_rejected").count() == 1
    assert Finding.objects.get(kind=Finding.Kind.REJECTED_MESSAGES).details["count"] == 5


def test_a_junk_name_creates_no_host() -> None:
    rejected(json.dumps(snapshot("nobody-knows")))
    assert not Host.objects.exists()
    assert SnapshotRejection.objects.get().host_name == "nobody-knows"


def test_a_future_dated_snapshot_is_rejected_and_never_hides_newer_ones() -> None:
    accept("gpu01")
    now = timezone.now()
    receive_snapshot(signed_snapshot(snapshot("gpu01", taken_at=now - timedelta(seconds=20))))
    far = signed_snapshot(snapshot("gpu01", processes=[proc(66)], taken_at=now + timedelta(hours=1)))
    assert "ahead of central's clock" in rejected(far).message
    # One a little ahead (within the bound) is stored, but read as taken when it arrived...
    near = signed_snapshot(snapshot("gpu01", processes=[proc(77)], taken_at=now + timedelta(minutes=4)))
    receive_snapshot(near, received_at=now)
    # ...so the next real one, taken after it arrived, is newer and shown.
    later = signed_snapshot(snapshot("gpu01", processes=[proc(88)], taken_at=now + timedelta(seconds=10)))
    receive_snapshot(later, received_at=now + timedelta(seconds=11))
    document = LatestSnapshot.objects.get(host__name="gpu01").document
    assert [p["pid"] for p in document["processes"]] == [88]


def test_forgetting_a_key_lets_the_host_offer_a_new_one(approver) -> None:
    accept("gpu01")
    trust.forget_host_key("gpu01", actor=approver)
    new_key = generate_private_key()
    assert receive_snapshot(signed_snapshot(snapshot("gpu01"), key=new_key)) is None
    host = Host.objects.get(name="gpu01")
    assert host.awaiting_acceptance and host.public_key == public_key_text(new_key)
    assert audit_actions()[-2:] == ["host_key_forgotten", "host_key_offered"]


def test_the_commands_accept_forget_and_print_the_central_key(capsys) -> None:
    receive_snapshot(signed_snapshot(snapshot("cmdbox")))
    with pytest.raises(CommandError, match="offered key"):
        call_command("accept_host", "cmdbox", fingerprint="SHA256:wrong")
    call_command("accept_host", "cmdbox", fingerprint=fingerprint(host_key("cmdbox")))
    assert Host.objects.get(name="cmdbox").key_accepted
    call_command("forget_host_key", "cmdbox")
    assert not Host.objects.get(name="cmdbox").public_key
    with pytest.raises(CommandError, match="no host named"):
        call_command("accept_host", "ghost")
    accepted = AuditEvent.objects.filter(action="host_accepted").get()
    assert accepted.details["by"].endswith("(manage.py accept_host)")
    capsys.readouterr()
    call_command("central_key")
    line = capsys.readouterr().out.strip()
    from django.conf import settings

    assert line == settings.GPUADMIN_CENTRAL_PUBLIC_KEY and line.startswith("ed25519:")


def offer(name: str, *, key=None, received_at=None) -> None:
    """``name``'s first signed snapshot (a fresh key each unless ``key``): it only offers the key."""
    document = snapshot(name, taken_at=received_at)
    assert receive_snapshot(signed_snapshot(document, key=key or generate_private_key()),
                            received_at=received_at) is None


def test_made_up_names_fill_the_offers_until_they_expire_and_free_their_slots(monkeypatch) -> None:
    monkeypatch.setattr(trust, "MAX_HOSTS_AWAITING", 3)
    for n in range(3):
        offer(f"made-up-{n}")
    assert "already await acceptance" in rejected(signed_snapshot(snapshot("newbox"))).message
    assert not Host.objects.filter(name="newbox").exists()

    # A day later (GPUADMIN_HOST_OFFER_EXPIRY_SECONDS) nobody renewed them: they go, the real host gets in.
    later = timezone.now() + timedelta(hours=25)
    offer("newbox", key=host_key("newbox"), received_at=later)
    assert list(Host.objects.awaiting_acceptance().values_list("name", flat=True)) == ["newbox"]
    withdrawn = AuditEvent.objects.filter(action="host_key_forgotten").order_by("sequence")
    assert [e.host_name for e in withdrawn] == ["made-up-0", "made-up-1", "made-up-2"]
    assert withdrawn[0].details["by"] == "central (offer expired)"


def test_an_offer_renewed_by_snapshots_does_not_expire_and_a_rekeyed_host_keeps_its_history(approver) -> None:
    accept("gpu01")
    receive_snapshot(signed_snapshot(snapshot("gpu01", processes=[proc(10)])))
    trust.forget_host_key("gpu01", actor=approver)
    offer("gpu01")  # its new key, never renewed
    renewing = generate_private_key()
    offer("renewed", key=renewing)
    now = timezone.now()
    offer("renewed", key=renewing, received_at=now + timedelta(hours=23))

    assert trust.expire_offers(now + timedelta(hours=25)) == 1
    host = Host.objects.get(name="gpu01")  # it has history: kept, without a key, as after forget_host_key
    assert not host.public_key and not host.awaiting_acceptance
    assert LatestSnapshot.objects.filter(host=host).exists()
    assert Host.objects.get(name="renewed").awaiting_acceptance


def test_an_agent_renewing_its_offer_every_interval_writes_one_audit_event(settings) -> None:
    """An agent awaiting acceptance probes on its own clock: each snapshot renews the offer, and only
    the first is an event in the audit log."""
    key, now = generate_private_key(), timezone.now()
    interval = timedelta(seconds=settings.GPUADMIN_PROBE_INTERVAL_SECONDS)
    for tick in range(5):
        offer("waiting", key=key, received_at=now + tick * interval)

    assert AuditEvent.objects.filter(action=Action.HOST_KEY_OFFERED).count() == 1
    host = Host.objects.get(name="waiting")
    assert host.key_offered_at == now + 4 * interval
    assert host.awaiting_acceptance and not LatestSnapshot.objects.filter(host=host).exists()


def test_one_key_offers_one_host() -> None:
    key = generate_private_key()
    offer("first", key=key)
    assert "already offered by host 'first'" in rejected(signed_snapshot(snapshot("second"), key=key)).message
    accept("gpu01")  # root on an enrolled host cannot claim new names with its key either
    refused = rejected(signed_snapshot(snapshot("gpu99"), key=host_key("gpu01")))
    assert "accepted for host 'gpu01'" in refused.message
    assert list(Host.objects.awaiting_acceptance().values_list("name", flat=True)) == ["first"]
