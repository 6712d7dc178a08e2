"""The host page's GPU cards: each GPU's health lines (gpuadmin/web/gpu_cards.py), unknown fields left
out, conditions marked; and the health findings above them, through the real ingest."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.urls import reverse

from gpuadmin.fleet.models import Finding
from gpuadmin.probe.gpus import GpuHealth
from gpuadmin.web.gpu_cards import HealthLine, health_lines
from tests.factories import GiB, gpu, proc
from tests.fleet.helpers import store

URL = reverse("host_detail", kwargs={"name": "gpu01"})
UNKNOWN = dict.fromkeys(GpuHealth.__slots__)


def sick_gpu(**health: Any) -> dict[str, Any]:
    record = gpu(0, uuid="GPU-sick")
    record["health"] = {**UNKNOWN, **health}
    return record


def test_only_what_the_gpu_said_is_shown_and_conditions_are_marked() -> None:
    document = {"gpus": [
        sick_gpu(temperature_celsius=93, power_draw_milliwatts=701_500, power_limit_milliwatts=700_000,
                 clock_event_reasons=["hw_thermal_slowdown"], remapped_rows_correctable=0,
                 remapped_rows_uncorrectable=1, remapped_rows_pending=True, remapped_rows_failed=False,
                 xid_errors=[{"xid": 94, "count": 2, "last_seen_at": "2026-12-04T10:00:00Z"}]),
        sick_gpu() | {"uuid": "GPU-mute"},
        gpu(2, uuid="GPU-old-agent"),
    ]}

    lines = health_lines(document)

    assert lines["GPU-sick"] == [
        HealthLine("Temperature", "93 °C", alert=True),
        HealthLine("Power", "702 W of 700 W"),
        HealthLine("Clocks held by", "hw thermal slowdown", alert=True),
        HealthLine("Remapped rows", "1 uncorrectable, 0 correctable; pending", alert=True),
        HealthLine("XID errors", "94 x2 (last 2026-12-04T10:00:00Z)", alert=True),
    ]
    assert lines["GPU-mute"] == []  # nothing known: no line drawn as zero
    assert "GPU-old-agent" not in lines  # a backend (or agent) that says nothing of health


@pytest.mark.django_db
def test_the_card_shows_health_and_the_findings_name_the_condition(viewer_client) -> None:
    store(gpus=[sick_gpu(temperature_celsius=71, remapped_rows_correctable=0, remapped_rows_uncorrectable=2,
                         remapped_rows_pending=True, remapped_rows_failed=False,
                         xid_errors=[{"xid": 79, "count": 1, "last_seen_at": "2026-12-04T10:00:00Z"}])])

    page = viewer_client.get(URL).content.decode()

    card = re.search(r'data-gpu-index="0">.*?<caption>Health</caption>.*?</table>', page, re.S).group(0)
    assert "<th>Temperature</th><td class=\"mono\">71 °C</td>" in card
    assert ("<th>Remapped rows</th><td class=\"mono severity-warning\">2 uncorrectable, 0 correctable; "
            "pending</td>") in card
    open_health = Finding.objects.open().filter(kind=Finding.Kind.GPU_HEALTH)
    assert sorted(f.key for f in open_health) == ["GPU-sick:row_remapping_pending", "GPU-sick:xid_79"]
    assert "GPU 0: XID 79, the GPU has fallen off the bus" in page
    assert "reset the GPU when it is idle (nvidia-smi -r -i 0)" in page

    # The next snapshot without the conditions resolves them.
    store(gpus=[sick_gpu(temperature_celsius=50)])
    assert not Finding.objects.open().filter(kind=Finding.Kind.GPU_HEALTH).exists()


@pytest.mark.django_db
def test_the_card_explains_memory_nobody_frees_with_the_numbers_compared(viewer_client) -> None:
    holder = proc(30, gpu_memory={"GPU-sim-0000": 3 * GiB}, leader_exited=True, reasons=["gpu"])
    store(processes=[holder], gpus=[gpu(0, used=11 * GiB)])

    page = viewer_client.get(URL).content.decode()

    explained = r'data-gpu-index="0">.*?<div class="memory-explained small">.*?</div>'
    card = re.search(explained, page, re.S).group(0)
    assert "11 GiB used, 3 GiB by visible processes, 8 GiB by no process" in card
    assert '<li data-cause="leader_exited">3 GiB held by pid 30, whose main thread exited' in card
    assert '<li data-cause="no_process">8 GiB held by no process the GPU lists.' in card
    assert "Driver-held" in card and "nvidia-smi -r -i 0" in card
