"""Kill reports kept as their host signed them and verified again later (gpuadmin/kills/signed_reports.py,
manage.py verify_kill_reports): a database writer who edits a stored report, or re-signs it, is caught."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from gpuadmin.audit import log
from gpuadmin.audit.models import Action
from gpuadmin.kills import services
from gpuadmin.kills.models import KillStep
from gpuadmin.wire.signing import fingerprint, generate_private_key
from tests.keys import host_key, signed_report
from tests.kills.helpers import file, refreshed

pytestmark = pytest.mark.django_db


@pytest.fixture
def approved(lab, requester, approver, sent, approve_committed):
    kill_request = file(requester, 4600)
    approve_committed(kill_request, approver)
    return refreshed(kill_request)


@pytest.fixture(autouse=True)
def accepted_in_log(db) -> None:
    """The audit log's record that gpu01's key was accepted (the lab host is enrolled without one)."""
    log.record(Action.HOST_ACCEPTED, host_name="gpu01",
               details={"fingerprint": fingerprint(host_key("gpu01"))})


def finished(kill_request, **fields) -> dict:
    return {"request_id": kill_request.order_request_id, "seq": 1, "event": "finished", "result": "refused",
            "at": datetime.now(UTC).isoformat(), "detail": "nothing to do", **fields}


def verify_kill_reports() -> str:
    out = StringIO()
    call_command("verify_kill_reports", stdout=out)
    return out.getvalue()


def edit_step(sql_assignments: str, params: tuple = ()) -> None:
    """Change a stored step behind the application's back, as a database writer would."""
    table = connection.ops.quote_name(KillStep._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {sql_assignments}", params)


def test_a_received_report_is_kept_as_signed_and_verifies_again(approved) -> None:
    message = signed_report(finished(approved), "gpu01")
    step = services.receive_report(message)
    kept = (step.signed_text, step.signature, step.signer_key, step.signer_fingerprint)
    assert kept == (message["text"], message["sig"], message["key"], fingerprint(host_key("gpu01")))
    assert verify_kill_reports() == "kill reports OK: 1 verified\n"


def test_a_kept_report_whose_text_was_edited_fails(approved) -> None:
    services.receive_report(signed_report(finished(approved), "gpu01"))
    edit_step("signed_text = REPLACE(signed_text, 'nothing to do', 'all killed')")

    with pytest.raises(CommandError, match=rf"request #{approved.pk} step 1: the kept report does not "
                                           "verify: the signature does not verify"):
        verify_kill_reports()


def test_a_step_edited_beside_its_kept_report_fails(approved) -> None:
    services.receive_report(signed_report(finished(approved), "gpu01"))
    edit_step("detail = %s, result = %s", ("all killed", "done"))

    with pytest.raises(CommandError, match="step 1: result, detail differ from what the host signed"):
        verify_kill_reports()


def test_a_report_re_signed_by_the_writer_with_their_own_key_fails(approved) -> None:
    services.receive_report(signed_report(finished(approved), "gpu01"))
    mallory = generate_private_key()
    forged = signed_report(finished(approved, detail="all killed"), "gpu01", key=mallory)
    edit_step("signed_text = %s, signature = %s, signer_key = %s, signer_fingerprint = %s, detail = %s",
              (forged["text"], forged["sig"], forged["key"], fingerprint(mallory), "all killed"))

    with pytest.raises(CommandError, match=re.escape(f"signed by {fingerprint(mallory)}, a key the audit log "
                                                     "never shows accepted for gpu01")):
        verify_kill_reports()


def test_steps_without_a_kept_report_are_counted_not_failed(approved) -> None:
    services.receive_report(signed_report(finished(approved), "gpu01"))
    edit_step("signed_text = ''")
    assert verify_kill_reports() == (
        "kill reports OK: 0 verified\n"
        f"1 steps have no kept report and cannot be verified (first: request #{approved.pk} step 1)\n"
    )
