"""Each audit event reads as one sentence, built from its fields: every action has one, a finished
kill reads as its story, and text from people and processes stays escaped with controls visible."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from gpuadmin.audit import log, sentences
from gpuadmin.audit.models import Action, AuditEvent
from gpuadmin.audit.sentences import describe, described, sentence_text
from gpuadmin.web.templatetags.gpuadmin_format import audit_sentence
from gpuadmin.wire.kill_protocol import OrderRefusal, Outcome, Refusal, Result
from tests.kills.helpers import EXIT_DETAIL, REASON, STORY_PID, finished_kill

pytestmark = pytest.mark.django_db

# The fewest fields an event of each action is written with; the sentence must still read.
MINIMAL_DETAILS = {
    Action.REQUESTED: {"reason": "r"},
    Action.APPROVED: {},
    Action.REJECTED: {"reason": "r"},
    Action.CANCELLED: {},
    Action.EXPIRED: {"why": "not approved before it expired"},
    Action.DISPATCHED: {},
    Action.STARTED: {},
    Action.SIGNAL_SENT: {"pid": 5, "signal": "SIGTERM"},
    Action.TARGET_EXITED: {"pid": 5},
    Action.TARGET_SURVIVED: {"pid": 5, "signal": "SIGKILL"},
    Action.REFUSED: {"pid": 1, "reason": "pid_1"},
    Action.FINISHED: {"result": "succeeded"},
    Action.MEMORY_RELEASED: {"released_bytes": 1024},
    Action.ORDER_REFUSED: {"reason": "bad_signature", "claimed_request_id": "3-ab"},
    Action.REPORT_CONFLICT: {"seq": 2},
    Action.HOST_KEY_OFFERED: {"fingerprint": "SHA256:abc"},
    Action.HOST_ACCEPTED: {"fingerprint": "SHA256:abc"},
    Action.HOST_KEY_FORGOTTEN: {"fingerprint": "SHA256:abc", "was_accepted": True},
    Action.MESSAGE_REJECTED: {"kind": "snapshot", "reason": "bad signature", "rejected_so_far": 3},
    Action.USER_CREATED: {"user": "ann"},
    Action.USER_CHANGED: {"user": "ann", "changed": ["email"]},
    Action.USER_DELETED: {"user": "ann"},
    Action.ROLES_CHANGED: {"user": "ann", "added": ["approver"], "roles": ["approver"]},
    Action.TOKEN_CREATED: {"user": "ann", "token": "ab12cd34"},
    Action.TOKEN_REVOKED: {"user": "ann", "token": "ab12cd34"},
    Action.TOTP_DEVICE_ADDED: {"user": "ann", "device": "phone"},
    Action.TOTP_DEVICE_REMOVED: {"user": "ann", "device": "phone"},
    Action.LOGIN_LOCKED_OUT: {"user": "ann", "address": "10.0.0.9"},
    Action.REAUTHENTICATED: {"user": "ann", "totp": True},
}


@pytest.mark.parametrize("action", list(Action), ids=[a.value for a in Action])
def test_every_action_has_a_sentence(action: Action):
    # A new action (a new event in gpuadmin/wire/kill_protocol.py, say) fails here until
    # gpuadmin/audit/sentences.py says it in words.
    assert sentences.has_sentence(action), f"no sentence for the audit action {action.value!r}"
    event = log.record(action, actor=None, kill_request_id=3, host_name="gpu01",
                       details=MINIMAL_DETAILS.get(action, {}))
    text = sentence_text(describe(event))
    assert text and action.value not in text.split(": ")[-1:], text
    assert "{" not in text, f"the sentence for {action.value} shows raw details: {text}"


@pytest.mark.parametrize(("words", "enum"), [
    (sentences.REFUSAL_WORDS, Refusal), (sentences.RESULT_WORDS, Result), (sentences.OUTCOME_WORDS, Outcome),
    (sentences.ORDER_REFUSAL_WORDS, OrderRefusal),
])
def test_every_protocol_word_has_words_for_people(words: dict, enum: type):
    assert set(words) == set(enum)


def test_a_finished_kill_reads_as_its_story(requester, approver):
    story = finished_kill(requester, approver)
    number = story.kill_request.pk
    events = described(AuditEvent.objects.filter(kill_request_id=number).order_by("sequence"))
    said = {e.action: sentence_text(e.sentence) for e in events}
    plan = "SIGINT → 10 s → SIGTERM → 20 s → SIGKILL → 30 s"

    assert [e.action for e in events] == [
        "requested", "approved", "dispatched", "started", "signal_sent", "target_exited", "finished",
        "memory_released",
    ]
    assert said["requested"] == (
        f"rick requested #{number}: kill pid {STORY_PID} python (alice) on gpu01, "
        "holding 10 GiB of GPU memory: "
        f"“{REASON}” — plan {plan}"
    )
    assert said["approved"].startswith(
        f"april approved #{number} (requested by rick: “{REASON}”) — plan {plan}")
    assert re.fullmatch(rf"central sent the order of #{number} to gpu01; it must start by \S+Z",
                        said["dispatched"])
    assert said["started"].startswith(f"gpu01 started #{number} — executing 3 steps")
    assert said["signal_sent"] == f"gpu01 sent SIGINT to PID {STORY_PID} python (alice)"
    assert said["target_exited"] == f"PID {STORY_PID} python (alice) exited after SIGINT — {EXIT_DETAIL}"
    assert said["finished"].startswith(f"#{number} succeeded: 1 of 1 target gone")
    assert re.fullmatch(
        rf"10 GiB of GPU memory back on gpu01 after #{number} \(GPU 0: 10 GiB\), "
        r"confirmed by the snapshot taken at \S+Z",
        said["memory_released"],
    )


def test_sentences_link_the_request_and_the_host(requester, approver):
    story = finished_kill(requester, approver)
    approved = AuditEvent.objects.get(kill_request_id=story.kill_request.pk, action=Action.APPROVED)
    html = str(audit_sentence(approved))
    assert f'<a href="{reverse("kill_request_detail", args=[story.kill_request.pk])}">' in html
    assert f'<q class="said">{REASON}</q>' in html
    dispatched = AuditEvent.objects.get(kill_request_id=story.kill_request.pk, action=Action.DISPATCHED)
    html = str(audit_sentence(dispatched))
    assert f'<a href="{reverse("host_detail", args=["gpu01"])}">gpu01</a>' in html
    assert '<time class="moment" datetime="' in html


def test_text_from_processes_is_escaped_with_controls_visible():
    event = log.record(
        Action.SIGNAL_SENT, host_name="<b>h</b>", kill_request_id=4,
        details={"pid": 9, "signal": "SIGINT", "name": "py\u202ethon<script>", "user": "\x1b[31mroot"},
    )
    html = str(audit_sentence(event))
    assert "<script>" not in html and "<b>h</b>" not in html and "\u202e" not in html and "\x1b" not in html
    assert "&lt;b&gt;h&lt;/b&gt;" in html
    assert '<span class="ctl" title="control character">\\u202e</span>' in html
    assert sentence_text(describe(event)) == (
        "<b>h</b> sent SIGINT to PID 9 py\\u202ethon<script> (\\x1b[31mroot)"
    )


def test_a_sentence_never_comes_from_stored_html():
    # Whatever the details say, the markup in a sentence is only ours.
    event = log.record(Action.REJECTED, kill_request_id=2, requester_name="alice",
                       details={"reason": '<a href="https://evil.example/">click</a>'})
    html = str(audit_sentence(event))
    assert 'href="https://evil.example/"' not in html
    assert "&lt;a href=&quot;https://evil.example/&quot;&gt;click&lt;/a&gt;" in html


@pytest.mark.parametrize(("details", "expected"), [
    ({"pid": 1, "reason": "pid_1", "detail": "refused: PID 1"}, "gpu01 refused to signal PID 1: it is PID 1"),
    ({"pid": 7, "reason": "something_new"}, "gpu01 refused to signal PID 7: something_new"),
])
def test_refusals_say_why(details: dict, expected: str):
    event = log.record(Action.REFUSED, host_name="gpu01", kill_request_id=1, details=details)
    assert sentence_text(describe(event)).startswith(expected)


def test_a_survivor_says_its_state_and_a_sweeper_failure_says_who_gave_up():
    survived = log.record(Action.TARGET_SURVIVED, kill_request_id=1,
                          details={"pid": 8, "name": "python", "signal": "SIGKILL", "state": "D"})
    assert sentence_text(describe(survived)) == (
        "PID 8 python survived SIGKILL, still in uninterruptible sleep (D)"
    )
    swept = log.record(Action.FINISHED, kill_request_id=1,
                       details={"result": "failed", "by": "central sweeper", "detail": "no report"})
    assert sentence_text(describe(swept)) == "central marked #1 failed — no report"


def test_rejections_cancellations_and_expiries_read_plainly():
    rejected = log.record(Action.REJECTED, kill_request_id=5, requester_name="rick",
                          details={"reason": "still training"}, actor=None)
    assert sentence_text(describe(rejected)) == "central rejected #5 (requested by rick): “still training”"
    expired = log.record(Action.EXPIRED, kill_request_id=5, details={
        "why": "not approved before it expired", "deadline": "2026-01-02T03:04:05+00:00"})
    assert sentence_text(describe(expired)) == (
        "#5 expired: not approved before it expired (deadline 2026-01-02T03:04:05Z)"
    )


def test_trust_events_read_as_sentences_with_the_host_and_the_key():
    accepted = log.record(Action.HOST_ACCEPTED, actor=None, host_name="gpu07",
                          details={"fingerprint": "SHA256:k3y", "by": "ops"})
    assert sentence_text(describe(accepted)) == "ops accepted the key SHA256:k3y of gpu07"
    refused = log.record(Action.ORDER_REFUSED, host_name="gpu07",
                         details={"reason": "wrong_host", "claimed_request_id": "9-ff",
                                  "detail": "for gpu08"})
    assert sentence_text(describe(refused)) == (
        "gpu07 refused a message naming request 9-ff: it is for another host — for gpu08"
    )


def test_account_events_name_the_account_and_what_changed():
    roles = log.record(Action.ROLES_CHANGED, actor=None,
                       details={"user": "ann", "added": ["approver"], "roles": ["approver", "viewer"]})
    assert sentence_text(describe(roles)) == (
        "central gave account ann the role(s) approver; now approver, viewer"
    )
    locked = log.record(Action.LOGIN_LOCKED_OUT, details={"user": "ann", "address": "10.0.0.9"})
    assert sentence_text(describe(locked)) == (
        "sign-in locked out for account ann from 10.0.0.9 after too many failed attempts"
    )
