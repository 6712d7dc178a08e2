"""One message to one destination through Apprise: a real local HTTP server, Django's email backend."""

from __future__ import annotations

import os
import subprocess
import sys

from django.core import mail

from gpuadmin.notify import delivery
from gpuadmin.notify.delivery import DELIVERY_FAILED, email_url, send, shown_url


def test_a_json_webhook_receives_the_title_and_body(inbox):
    outcome = send(inbox.url("ok"), "Kill request #3 waits", "alice's train.py holds 10 GiB")
    assert outcome.ok, outcome.error
    (message,) = inbox.received
    assert message["title"] == "Kill request #3 waits"
    assert message["message"] == "alice's train.py holds 10 GiB"


def test_an_email_address_goes_through_djangos_email_backend(settings):
    settings.DEFAULT_FROM_EMAIL = "gpuadmin@lab.example"
    outcome = send(email_url("alice+gpu@lab.example"), "Your request was approved", "by april")
    assert outcome.ok, outcome.error
    (message,) = mail.outbox
    assert message.to == ["alice+gpu@lab.example"]
    assert message.subject == "Your request was approved"
    assert message.body.strip() == "by april"
    assert message.from_email == "gpuadmin@lab.example"


def test_a_failing_endpoint_is_reported_and_its_answer_goes_to_the_log_only(inbox, caplog):
    outcome = send(inbox.url("fail"), "t", "b")
    assert not outcome.ok
    assert outcome.error == DELIVERY_FAILED  # a person sees no status or body of the server's
    assert inbox.failed_attempts == 1
    assert any("500" in record.getMessage() for record in caplog.records if record.name == delivery.__name__)


def test_a_failing_email_backend_is_reported(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", 9  # discard port: nothing listens
    outcome = send(email_url("alice@lab.example"), "t", "b")
    assert not outcome.ok
    assert outcome.error


def test_a_url_apprise_does_not_know_is_a_failure_not_an_exception():
    outcome = send("nosuchservice://x", "t", "b")
    assert not outcome.ok
    assert "nosuchservice:// is not a scheme gpuadmin sends to" in outcome.error
    outcome = send("json://127.1/", "t", "b")  # an allowed scheme Apprise cannot parse
    assert not outcome.ok
    assert "not a notification URL" in outcome.error


def test_the_shown_form_masks_secrets(inbox):
    shown = shown_url(f"json://hook:s3cr3t-token@127.0.0.1:{inbox.server_port}/ok")
    assert "s3cr3t-token" not in shown
    assert "127.0.0.1" in shown


def test_loading_the_apps_leaves_apprise_unimported_until_a_first_delivery():
    # Every worker, page server and management command loads the apps; Apprise (with requests and its
    # 100+ plugins) is needed only where something is sent.
    program = ("import sys, django; django.setup(); print('apprise' in sys.modules); "
               "from gpuadmin.notify.delivery import shown_url; shown_url('json://example.org/hook'); "
               "print('apprise' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "DJANGO_SETTINGS_MODULE": "gpuadmin.settings"}, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True"]
