"""A real browser walks a real `make demo` (``python -m gpuadmin.run --demo``, not live_server).

Once the demo host shows every scenario, the printed demo requester logs in,
looks at the fleet and the demo host (screenshots kept), asks to kill the
trainer that checkpoints on SIGINT; the printed approver approves; the
trainer really ends (its checkpoint is written) and the timeline says so.
Then Ctrl+C ends the rest: nothing left.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from gpuadmin.demo.fleet import HOSTS as SYNTHETIC_HOSTS
from gpuadmin.demo.programs import LABEL
from tests.browser.helpers import CLEAN_DOM, NO_LIVE_PAYLOAD, RECORD_VIOLATIONS, Guard, log_in, log_out
from tests.demo.helpers import HOST, demo_processes, start_demo, wait_for_scenarios
from tests.run.helpers import in_groups_or_sessions

TIMEOUT_SECONDS = 90


def check_page(page, guard: Guard, screenshot, name: str) -> None:
    page.wait_for_load_state("networkidle")
    screenshot(page, name)
    assert page.evaluate(NO_LIVE_PAYLOAD) == CLEAN_DOM, name
    guard.assert_clean()


def test_a_browser_walks_the_demo_and_a_kill_through_the_panel_ends_a_demo_process(
    new_context, screenshot, tmp_path: Path,
) -> None:
    demo = start_demo(tmp_path / "data")
    try:
        hosts = wait_for_scenarios(demo)
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
    finally:
        demo.run.kill_everything(demo.groups)
