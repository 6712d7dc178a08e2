"""gpuadmin/settings.py: static files as production serves them (the test run itself names them
unhashed, tests/environment.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# In a process of its own, with the settings read afresh: what a page names and how it is served.
SERVE_A_STATIC_FILE = """
import json, django
django.setup()
from django.templatetags.static import static
from django.test import Client
url = static("css/gpuadmin.css")
answer = Client().get(url, HTTP_ACCEPT_ENCODING="gzip")
unhashed = Client().get("/static/css/gpuadmin.css")
print(json.dumps({"url": url, "status": answer.status_code, "cache": answer["Cache-Control"],
                  "encoding": answer.get("Content-Encoding"), "unhashed_cache": unhashed["Cache-Control"]}))
"""


def test_static_files_are_hashed_compressed_and_cached_for_a_year(tmp_path):
    env = {**os.environ, "GPUADMIN_DATA_DIR": str(tmp_path), "GPUADMIN_STATIC_HASHED": "1",
           "DJANGO_SETTINGS_MODULE": "gpuadmin.settings"}
    subprocess.run([sys.executable, "-m", "gpuadmin.data_dir"], env=env, check=True, capture_output=True)
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "--verbosity", "0"],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    written = tmp_path / "static" / "css"
    assert [p.name for p in written.glob("gpuadmin.*.css.gz")], sorted(p.name for p in written.iterdir())

    served = json.loads(subprocess.run([sys.executable, "-c", SERVE_A_STATIC_FILE], cwd=ROOT, env=env,
                                       check=True, capture_output=True, text=True).stdout)
    assert served["url"].startswith("/static/css/gpuadmin.") and served["url"] != "/static/css/gpuadmin.css"
    assert served["status"] == 200
    assert served["encoding"] == "gzip"
    max_age = int(served["cache"].split("max-age=")[1].split(",")[0])
    assert max_age >= 365 * 24 * 3600 and "immutable" in served["cache"]
    # The name without a hash may change under it: browsers ask again soon.
    assert "max-age=60" in served["unhashed_cache"]


def test_the_tests_name_static_files_unhashed(settings):
    assert settings.STORAGES["staticfiles"]["BACKEND"].endswith("StaticFilesStorage")
    assert "Manifest" not in settings.STORAGES["staticfiles"]["BACKEND"]
