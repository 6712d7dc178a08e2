"""The OpenAPI schema (/api/v1/schema/) against the API's real answers, and against docs/api.md.

Every documented operation is called for real (token or session, real
services, a host with a real ingest behind it) and each answer's body is
validated against the schema the endpoint documents for that status; a status
the schema does not document fails too. docs/api.md's endpoint headings and
the schema's operations must be the same set.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from jsonschema import Draft202012Validator, FormatChecker
from knox.models import AuthToken

from gpuadmin.celery import app
from gpuadmin.fleet.models import Host
from gpuadmin.web.api_docs import endpoints
from tests.keys import deliver, enrol
from tests.kills.helpers import STORY_PID, file, finished_kill, lab_snapshot, protect_like_the_lab
from tests.people import client_for

pytestmark = pytest.mark.django_db
DOCS = Path(__file__).resolve().parents[1] / "docs" / "api.md"
HEADING = re.compile(r"^### `(GET|POST) (/api/v1/[^`? ]*)", re.MULTILINE)


def schema_of(client: Client) -> dict[str, Any]:
    response = client.get(reverse("api_schema"), HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200, response.content[:500]
    return json.loads(response.content)


def template_of(schema: dict[str, Any], path: str) -> str:
    """The schema's path template that ``path`` (no query) matches: a literal one first."""
    for template in sorted(schema["paths"], key=lambda t: "{" in t):
        pattern = re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", re.escape(template.rstrip("/")))
        if re.fullmatch(pattern + "/?", path):
            return template
    raise AssertionError(f"{path} is not in the schema")


class Checker:
    """Calls the API and validates each answer against what the schema documents for it."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        self.seen: set[tuple[str, str, int]] = set()

    def __call__(self, client: Client, method: str, url: str, status: int, data: Any = None,
                 **extra: Any) -> dict[str, Any] | list[Any]:
        if method == "get":
            response = client.get(url, data or {}, **extra)
        else:
            response = client.post(url, json.dumps(data or {}), content_type="application/json", **extra)
        assert response.status_code == status, (url, response.content[:1000])
        template = template_of(self.schema, url.split("?", maxsplit=1)[0])
        answers = self.schema["paths"][template][method]["responses"]
        assert str(status) in answers, f"{method.upper()} {template} answered {status}, not documented"
        body_schema = answers[str(status)]["content"]["application/json"]["schema"]
        body = response.json()
        validator = Draft202012Validator({**body_schema, "components": self.schema["components"]},
                                         format_checker=FormatChecker())
        problems = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                    for e in validator.iter_errors(body)]
        assert not problems, f"{method.upper()} {url} ({status}) does not match the schema:\n" + "\n".join(
            problems[:20])
        self.seen.add((template, method, status))
        return body


def test_every_documented_endpoint_answers_as_the_schema_says(  # noqa: PLR0917 - fixtures
    settings, viewer, requester, approver, second_approver, stranger, monkeypatch,
) -> None:
    protect_like_the_lab(settings)
    settings.GPUADMIN_USAGE_FLUSH_SECONDS = 0  # the usage ledger written at each snapshot
    monkeypatch.setattr(app, "send_task", lambda *args, **kwargs: None)  # the broker is not under test
    enrol(Host.objects.create(name="gpu01", first_seen_at=timezone.now()))
    for minutes in (5, 4, 3):  # history samples, findings, process lives: ingest as it runs
        deliver(json.dumps(lab_snapshot(extra_used={"GPU-sim-0001": 3 * 2**30},
                                                taken_at=timezone.now() - timedelta(minutes=minutes))))
    story = finished_kill(requester, approver)  # a succeeded request, its steps and audit events
    pending = file(requester, 4600)
    to_reject = file(requester, 4121, start=412100)

    viewer_client = client_for(viewer)
    schema = schema_of(viewer_client)
    check = Checker(schema)
    _, token = AuthToken.objects.create(user=second_approver)
    by_token = {"HTTP_AUTHORIZATION": f"Token {token}"}
    anonymous = Client()

    check(viewer_client, "get", "/api/v1/hosts/", 200)
    detail = check(viewer_client, "get", "/api/v1/hosts/gpu01/", 200)
    assert detail["zombie_trees"] and detail["findings"] and detail["processes"]
    check(viewer_client, "get", "/api/v1/hosts/nowhere/", 404)
    check(anonymous, "get", "/api/v1/hosts/", 401)
    check(client_for(stranger), "get", "/api/v1/hosts/", 403)
    for chart_range in ("1h", "24h"):
        history = check(viewer_client, "get", f"/api/v1/hosts/gpu01/history/?range={chart_range}", 200)
    assert history["gpus"][0]["points"] or chart_range == "24h"
    check(viewer_client, "get", "/api/v1/hosts/gpu01/history/?range=1y", 400)
    check(viewer_client, "get", "/api/v1/hosts/gpu01/processes/4300-430000/", 200)
    check(viewer_client, "get", f"/api/v1/hosts/gpu01/processes/{STORY_PID}-1/", 404)

    check(viewer_client, "get", "/api/v1/kill-requests/", 200)
    check(viewer_client, "get", "/api/v1/kill-requests/?status=succeeded&host=gpu01", 200)
    check(viewer_client, "get", "/api/v1/kill-requests/?status=nonsense", 400)
    check(viewer_client, "get", f"/api/v1/kill-requests/{story.kill_request.pk}/", 200)
    check(viewer_client, "get", f"/api/v1/kill-requests/{pending.pk}/", 200)
    check(viewer_client, "get", "/api/v1/kill-requests/999999/", 404)
    check(viewer_client, "get", "/api/v1/kill-requests/preview?host=gpu01&pid=4120&start_time_ticks=412000"
          "&include_descendants=true", 200)
    zombie = "/api/v1/kill-requests/preview?host=gpu01&pid=4200&start_time_ticks=420000"
    assert check(viewer_client, "get", zombie, 200)["parent_offer"]
    check(viewer_client, "get", "/api/v1/kill-requests/preview?host=gpu01&pid=x", 400)

    requester_client = client_for(requester)
    check(requester_client, "post", "/api/v1/kill-requests/", 201,
          {"host": "gpu01", "pid": 4123, "start_time_ticks": 412300, "reason": "schema test"})
    check(requester_client, "post", "/api/v1/kill-requests/", 400, {"pid": 4123})
    check(requester_client, "post", "/api/v1/kill-requests/", 409,
          {"host": "gpu01", "pid": 4600, "start_time_ticks": 460000, "reason": "again"})
    check(requester_client, "post", "/api/v1/kill-requests/", 422,
          {"host": "gpu01", "pid": 1, "start_time_ticks": 100, "reason": "init"})
    check(viewer_client, "post", "/api/v1/kill-requests/", 403,
          {"host": "gpu01", "pid": 4300, "start_time_ticks": 430000, "reason": "not mine to ask"})

    check(anonymous, "post", f"/api/v1/kill-requests/{pending.pk}/approve", 401)
    check(requester_client, "post", f"/api/v1/kill-requests/{pending.pk}/approve", 403)  # not an approver
    check(anonymous, "post", f"/api/v1/kill-requests/{pending.pk}/approve", 200, **by_token)
    check(anonymous, "post", f"/api/v1/kill-requests/{pending.pk}/approve", 409, **by_token)
    check(anonymous, "post", "/api/v1/kill-requests/999999/approve", 404, **by_token)
    check(anonymous, "post", f"/api/v1/kill-requests/{to_reject.pk}/reject", 200, {"reason": "not now"},
          **by_token)
    check(requester_client, "post", f"/api/v1/kill-requests/{pending.pk}/cancel", 200, {"reason": "done"})
    check(requester_client, "post", f"/api/v1/kill-requests/{pending.pk}/cancel", 409)

    check(viewer_client, "get", "/api/v1/audit/", 200)
    check(viewer_client, "get", f"/api/v1/audit/?kill_request={story.kill_request.pk}&page_size=2&page=2",
          200)
    check(viewer_client, "get", "/api/v1/audit/?kill_request=x", 400)
    check(viewer_client, "get", "/api/v1/audit/verify", 200)

    usage = check(viewer_client, "get", "/api/v1/usage/?by=host", 200)
    assert usage["rows"], "the snapshots above held GPU memory"
    check(viewer_client, "get", "/api/v1/usage/?by=nobody", 400)

    operations = {(template, method) for template, item in schema["paths"].items() for method in item}
    answered = {(template, method) for template, method, status in check.seen if status < 300}
    assert operations == answered, f"never called with success: {sorted(operations - answered)}"


def test_docs_api_md_names_exactly_the_schemas_operations(viewer_client) -> None:
    schema = schema_of(viewer_client)
    documented = {(method.lower(), re.sub(r"<([a-z_]+)>", r"{\1}", path).rstrip("/"))
                  for method, path in HEADING.findall(DOCS.read_text())}
    served = {(method, template.rstrip("/").replace("{id}", "{id}"))
              for template, item in schema["paths"].items() for method in item}
    assert documented == served


def test_the_schema_page_lists_every_operation_without_script(viewer_client) -> None:
    schema = schema_of(viewer_client)
    response = viewer_client.get(reverse("api_docs"))
    assert response.status_code == 200
    page = response.content.decode()
    for endpoint in endpoints(schema):
        # A path breaks only after a slash on a narrow screen.
        assert f"<code>{endpoint['path'].replace('/', '/<wbr>')}</code>" in page
    assert "<script>" not in page.split("</head>")[1]
    assert 'class="data api-endpoints stack"' in page  # row separators; a card per endpoint on a phone
    assert "`" not in page.split("<h2>Shapes</h2>")[0]  # backticks became <code>


def test_the_schema_needs_a_viewer(client, stranger) -> None:
    assert client.get(reverse("api_schema")).status_code == 401
    assert client_for(stranger).get(reverse("api_schema")).status_code == 403


def test_the_schema_is_yaml_by_default_and_json_on_request(viewer_client) -> None:
    response = viewer_client.get(reverse("api_schema"))
    assert response.status_code == 200 and response.content.startswith(b"openapi: 3.1.0")
    response = viewer_client.get(reverse("api_schema"), {"format": "json"})
    assert json.loads(response.content)["openapi"] == "3.1.0"


def test_the_schema_is_valid_openapi_and_generated_without_warnings(tmp_path) -> None:
    # --validate checks it against the OpenAPI 3.1 meta-schema; a view it cannot read is a warning.
    call_command("spectacular", "--fail-on-warn", "--validate", "--file", str(tmp_path / "schema.yaml"))
    assert (tmp_path / "schema.yaml").read_text().startswith("openapi: 3.1.0")
