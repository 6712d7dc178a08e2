"""A GPU reset request: filed, approved by a second admin, sent as a signed order, run by the agent's own
code on the simulated backend with a real process holding the GPU's device file, and reported back.

While the holder lives the agent refuses, naming it; once it is gone a new request resets the GPU and
the simulated GPU's used memory is 0.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from gpuadmin.agent import killing
from gpuadmin.audit.models import AuditEvent
from gpuadmin.audit.sentences import describe, sentence_text
from gpuadmin.kills import services
from gpuadmin.kills.models import KillRequest
from gpuadmin.kills.states import Status
from gpuadmin.probe import procfs
from gpuadmin.probe.gpus import simulated
from tests.factories import GiB, gpu, proc, snapshot
from tests.keys import deliver, install_agent_key
from tests.kills.helpers import actions, refreshed, store_snapshot
from tests.people import client_for
from tests.probe.helpers import Processes

pytestmark = pytest.mark.django_db

UUID = "GPU-sim-0000"
REASON = "18 GiB held by no process since the kill of #7"


@pytest.fixture
def simulated_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """The agent's simulated GPU file (18 GiB held by no process) and the file standing for /dev/nvidia0."""
    device = tmp_path / "nvidia0"
    device.write_bytes(b"")
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps({"gpus": [{
        "uuid": UUID, "name": "Simulated H100", "memory_total_bytes": 80 * GiB,
        "extra_used_bytes": 18 * GiB, "utilization_percent": 0, "device": str(device),
        "persistence_mode": False,
    }], "processes": []}))
    monkeypatch.setenv("GPUADMIN_GPU_BACKEND", "simulated")
    monkeypatch.setenv("GPUADMIN_SIMULATED_GPUS", str(path))
    return path, device


@pytest.fixture
def agent_in_process(settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sent: Any) -> Any:
    """Orders run through the agent's own code as host gpu01; its signed reports go straight to central."""
    settings.DATA_DIR = tmp_path / "agent-data"
    settings.GPUADMIN_HOST_NAME = "gpu01"
    install_agent_key(settings.DATA_DIR, "gpu01")
    monkeypatch.setattr(killing, "report_to_central",
                        lambda event: services.receive_report(killing.signed_report(event)))

    def run_last_order() -> dict[str, Any]:
        return killing.execute(sent.orders()[-1])

    return run_last_order


@pytest.fixture
def holders() -> Any:
    tracked = Processes()
    try:
        yield tracked
    finally:
        tracked.cleanup()


def reset_via_request(requester: Any, approver: Any, approve_committed: Any, run_order: Any
                      ) -> tuple[KillRequest, dict[str, Any]]:
    kill_request = services.file_reset_request(requester, host="gpu01", gpu_uuid=UUID, reason=REASON)
    approve_committed(kill_request, approver)
    finished = run_order()
    return refreshed(kill_request), finished


def test_a_reset_request_is_refused_while_a_holder_exists_and_resets_the_gpu_once_it_is_gone(
    *, simulated_gpu: tuple[Path, Path], holders: Processes, requester: Any, approver: Any,
    approve_committed: Any, agent_in_process: Any, sent: Any,
) -> None:
    path, device = simulated_gpu
    holder = holders.start("holder", str(device))
    store_snapshot(snapshot(
        "gpu01", boot_id=procfs.read_boot_id(), gpus=[gpu(0, used=18 * GiB)],
        processes=[proc(holder.pid, name="python", device_files=["/dev/nvidia0"])],
    ))

    refused, finished = reset_via_request(requester, approver, approve_committed, agent_in_process)

    (order,) = sent.orders()
    assert json.loads(order["text"])["action"] == "reset_gpu"  # signed like every order
    assert finished["reason"] == "gpu_held"
    assert refused.status == Status.REFUSED
    assert f"held by pid {holder.pid} (" in refused.result_detail
    assert any("pid" in warning and "end them first" in warning for warning in refused.warnings)
    assert actions(refused) == ["requested", "approved", "dispatched", "started", "finished"]
    assert simulated.read(str(path)).gpus[0].memory_used_bytes == 18 * GiB

    os.kill(holder.pid, signal.SIGKILL)
    holder.process.wait(timeout=10)
    done, finished = reset_via_request(requester, approver, approve_committed, agent_in_process)

    assert done.status == Status.SUCCEEDED, done.result_detail
    assert "persistence mode off" in done.result_detail
    assert simulated.read(str(path)).gpus[0].memory_used_bytes == 0


def test_a_reset_request_needs_a_second_admin_and_a_gpu_the_host_has(
    simulated_gpu: tuple[Path, Path], requester: Any, approver: Any
) -> None:
    store_snapshot(snapshot("gpu01", boot_id=procfs.read_boot_id(), gpus=[gpu(0, used=18 * GiB)]))

    with pytest.raises(services.Refused, match="shows no GPU GPU-elsewhere"):
        services.file_reset_request(requester, host="gpu01", gpu_uuid="GPU-elsewhere", reason=REASON)
    with pytest.raises(services.BadInput, match="reason"):
        services.file_reset_request(requester, host="gpu01", gpu_uuid=UUID, reason=" ")
    kill_request = services.file_reset_request(requester, host="gpu01", gpu_uuid=UUID, reason=REASON)
    with pytest.raises(services.Conflict, match="already has an open reset request"):
        services.file_reset_request(requester, host="gpu01", gpu_uuid=UUID, reason=REASON)
    with pytest.raises(services.NotAllowed):
        services.approve(kill_request.pk, requester)
    assert kill_request.plan_text == f"reset GPU 0 ({UUID}), only if nothing holds it then"
    requested = AuditEvent.objects.get(action="requested", kill_request_id=kill_request.pk)
    assert f"requested #{kill_request.pk}: reset GPU 0 {UUID} on gpu01" in sentence_text(describe(requested))


def test_the_host_page_offers_a_reset_where_memory_is_driver_held_and_the_request_page_shows_it(
    simulated_gpu: tuple[Path, Path], requester: Any, viewer: Any
) -> None:
    deliver(snapshot("gpu01", boot_id=procfs.read_boot_id(), gpus=[gpu(0, used=18 * GiB)]))
    client = client_for(requester)

    host_page = client.get("/hosts/gpu01/").content.decode()
    form = client.get(f"/kills/reset/new/?host=gpu01&gpu={UUID}").content.decode()
    filed = client.post("/kills/reset/new/", {"host": "gpu01", "gpu": UUID, "reason": REASON})

    assert f'class="request-reset" href="/kills/reset/new/?host=gpu01&amp;gpu={UUID}"' in host_page
    assert "request-reset" not in client_for(viewer).get("/hosts/gpu01/").content.decode()
    assert "File the reset request" in form and UUID in form
    kill_request = KillRequest.objects.get(action=KillRequest.Action.RESET_GPU)
    assert filed.status_code == 302 and filed["Location"] == f"/kills/{kill_request.pk}/"
    page = client.get(filed["Location"]).content.decode()
    assert f"GPU reset request #{kill_request.pk}" in page and f"reset GPU 0 ({UUID})" in page
    assert "<h2>Targets</h2>" not in page
