"""Pages, htmx fragments and the API's JSON leave compressed when the browser takes gzip (settings'
GZipMiddleware; BREACH: docs/security.md, "Compression")."""

import gzip
import json

import pytest
from django.urls import reverse

from tests.fleet.helpers import store_busy_host

pytestmark = pytest.mark.django_db

GZIP = {"HTTP_ACCEPT_ENCODING": "gzip, deflate, br"}


def test_the_fleet_page_is_compressed(viewer_client):
    for n in range(20):
        store_busy_host(f"gpu{n:02d}")
    response = viewer_client.get(reverse("fleet"), **GZIP)
    assert response["Content-Encoding"] == "gzip"
    assert "Accept-Encoding" in response["Vary"]
    page = gzip.decompress(response.content)
    assert b'data-host="gpu19"' in page
    assert len(response.content) * 4 < len(page)


def test_the_api_json_is_compressed(viewer_client):
    store_busy_host("gpu01")
    response = viewer_client.get(reverse("api_hosts"), **GZIP)
    assert response["Content-Encoding"] == "gzip"
    assert "gpu01" in json.dumps(json.loads(gzip.decompress(response.content)))


def test_a_client_that_takes_no_gzip_gets_it_plain(viewer_client):
    store_busy_host("gpu01")
    response = viewer_client.get(reverse("fleet"))
    assert not response.has_header("Content-Encoding")
    assert b'data-host="gpu01"' in response.content
