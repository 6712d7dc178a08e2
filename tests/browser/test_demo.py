"""`make demo` for real (``python -m gpuadmin.run --demo``, not live_server), booted once and walked
by a real browser.

The demo starts its processes and prints its accounts; once the demo host shows every scenario
(and the synthetic hosts are on the fleet), the printed demo requester logs in, looks at the fleet
and the demo host (screenshots kept), asks to kill the trainer that checkpoints on SIGINT; the
printed approver approves; the trainer really ends (its checkpoint is written) and the timeline
says so. Then Ctrl+C ends every other demo process: nothing left, no zombie.

One test, one boot: `make demo` takes most of a minute to show everything, and the two halves
(what it starts, what a person sees) need the same running demo. That Ctrl+C stops the trainer
with SIGINT, as a Ctrl+C'd training job is stopped, is tests/demo/test_scenario.py's (the trainer
ends through the panel here first).
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from pathlib import Path

from gpuadmin.demo.fleet import HOSTS as SYNTHETIC_HOSTS
from gpuadmin.demo.programs import LABEL
from gpuadmin.demo.scenario import HEALTH_CONDITIONS
from tests.browser.helpers import CLEAN_DOM, NO_LIVE_PAYLOAD, RECORD_VIOLATIONS, Guard, log_in, log_out
from tests.demo.helpers import (
    HOST,
    Demo,
    demo_processes,
    open_findings,
    open_health_conditions,
    start_demo,
    wait_for_scenarios,
)
from tests.run.helpers import in_groups_or_sessions, zombies_of

TIMEOUT_SECONDS = 90


def check_page(page, guard: Guard, screenshot, name: str) -> None:
    page.wait_for_load_state("networkidle")
    screenshot(page, name)
    assert page.evaluate(NO_LIVE_PAYLOAD) == CLEAN_DOM, name
    guard.assert_clean()


def check_what_the_demo_started(demo: Demo) -> dict[str, dict]:
    """Its accounts, its processes, every scenario on the demo host; every host's latest document."""
    assert set(demo.accounts) == {"demo-requester", "demo-approver"}, demo.run.output
    children = demo.run.started_children()
    assert sum(name.startswith("demo: ") for name in children) == 9, children
    with urllib.request.urlopen(f"{demo.url}/login/", timeout=10) as response:
        assert response.status == 200

    hosts = wait_for_scenarios(demo)
    assert {h.name for h in SYNTHETIC_HOSTS} <= {name for name, document in hosts.items() if document}
    assert "zombies" in open_findings(demo.env, "sim-a100-02")
    assert "orphan_gpu" in open_findings(demo.env, HOST)
    assert open_health_conditions(demo.env, HOST) == HEALTH_CONDITIONS
    # web and worker with their own children, 14 demo processes and their zombies
    assert len(in_groups_or_sessions(demo.groups)) > 20
    return hosts


def test_make_demo_shows_every_scenario_a_browser_kills_its_trainer_and_ctrl_c_ends_the_rest(
    new_context, screenshot, tmp_path: Path,
) -> None:
    demo = start_demo(tmp_path / "data")
    try:
        hosts = check_what_the_demo_started(demo)
        trainer = demo_processes(hosts[HOST], "checkpointing-trainer")[0]
        page = new_context(base_url=demo.url).new_page()
        guard = Guard(page)
        page.add_init_script(RECORD_VIOLATIONS)
        page.on("console", lambda m: guard.console_errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda error: guard.page_errors.append(str(error)))
        page.set_default_timeout(30_000)

        log_in(page, demo.url, "demo-requester", demo.accounts["demo-requester"])
        page.goto(f"{demo.url}/")
        check_page(page, guard, screenshot, "fleet")
        fleet = page.inner_text("main")
        assert all(host.name in fleet for host in SYNTHETIC_HOSTS) and HOST in fleet

        page.goto(f"{demo.url}/hosts/{HOST}/")
        check_page(page, guard, screenshot, "demo-host")
        shown = page.inner_text("main")
        # The findings' titles: orphans, unattributed memory, a leak, an idle holder, zombies.
        for words in (LABEL, "simulated", "orphans of launcher", "used by no visible process",
                      "keeps rising", "at 0% utilization", "zombies under",
                      "<script>alert('gpuadmin')</script>", "\\x1b[31m"):
            assert words in shown, words

        page.click(f'a.request-kill[href*="pid={trainer["pid"]}&"]')
        check_page(page, guard, screenshot, "request-kill")
        page.fill("textarea[name=reason]", "demo: the trainer should save a checkpoint and stop")
        with page.expect_navigation():
            page.click("text=File the request")
        request_url = page.url
        log_out(page)

        log_in(page, demo.url, "demo-approver", demo.accounts["demo-approver"])
        page.goto(request_url)
        with page.expect_navigation():
            page.click("button:text-is('Approve')")
        page.wait_for_selector("#timeline .kill-status-succeeded", timeout=TIMEOUT_SECONDS * 1000)
        check_page(page, guard, screenshot, "kill-succeeded")
        deadline = time.monotonic() + TIMEOUT_SECONDS  # reaped by the supervisor shortly after
        while Path(f"/proc/{trainer['pid']}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not Path(f"/proc/{trainer['pid']}").exists()
        checkpoint = demo.data_dir / "scenario" / f"checkpoint-{trainer['pid']}.txt"
        assert checkpoint.read_text().startswith("checkpoint written on SIGINT")
        page.context.close()

        os.kill(demo.run.command_pid, signal.SIGINT)
        exit_status, leftovers = demo.run.finish(timeout_seconds=90)
        assert (exit_status, leftovers) == (0, []), demo.run.output
        assert in_groups_or_sessions(demo.groups) == []
        assert zombies_of({demo.run.command_pid}) == []
    finally:
        demo.run.kill_everything(demo.groups)
