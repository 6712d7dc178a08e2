"""The Django admin shows kill requests; it cannot add, change or delete them
(only the workflow services may, since they keep the audit log in step)."""

from __future__ import annotations

import pytest
from django.test import Client

from gpuadmin.kills.models import KillRequest
from tests.kills.helpers import file

pytestmark = pytest.mark.django_db


def test_the_admin_shows_requests_but_cannot_add_change_or_delete(lab, requester, django_user_model):
    kill_request = file(requester, 4600)
    client = Client()
    client.force_login(django_user_model.objects.create_superuser("root", password="x"))

    assert client.get("/admin/kills/killrequest/").status_code == 200
    change = client.get(f"/admin/kills/killrequest/{kill_request.pk}/change/")
    assert change.status_code == 200  # read-only view
    assert b'name="_save"' not in change.content
    assert client.get("/admin/kills/killrequest/add/").status_code == 403
    delete = client.post(f"/admin/kills/killrequest/{kill_request.pk}/delete/", {"post": "yes"})
    assert delete.status_code == 403
    assert KillRequest.objects.filter(pk=kill_request.pk).exists()
