"""The worker's live dashboards page, rendered by a real browser (Debian's chromium, headless)
while the simulated fleet runs: every panel of the Grafana dashboards, with real data."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

from agents.publisher import KafkaPublisher
from schemas.codec import encode
from schemas.commands import RouteAction, RouteCommand, Target
from schemas.topics import ROUTE_COMMANDS
from sre.dashboards import load_dashboards
from tests.factories import signed_command
from tests.integration.sim_proc import SimProcess, until
from tests.integration.worker_proc import WorkerProcess


def _browser() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "needs Debian's chromium package (scripts/test.sh installs it)"
    return found


def _render(url: str) -> str:
    done = subprocess.run(
        [
            _browser(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--virtual-time-budget=5000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_live_dashboards_render_in_headless_chromium(
    closed_loop: tuple[SimProcess, WorkerProcess], kafka_bootstrap: str, topic_prefix: str
) -> None:
    sim, worker = closed_loop
    drain = signed_command(
        RouteCommand,
        issued_at=sim.now(),
        ttl_s=300,
        reason="page_test",
        target=Target(device_uuid="node-00002-gpu1"),
        action=RouteAction.DRAIN,
    )

    async def send() -> None:
        async with KafkaPublisher(kafka_bootstrap, topic_prefix=topic_prefix) as publisher:
            await publisher.publish_raw(
                ROUTE_COMMANDS.name, ROUTE_COMMANDS.key_for(drain), encode(drain)
            )
            await publisher.flush()

    asyncio.run(send())
    until(
        lambda: worker.sql("SELECT count() FROM fleetloop.command_results")[0][0] >= 1,
        what="the drain's result",
        proc=sim,
    )
    until(
        lambda: (
            worker.sql("SELECT uniqExact(minute) FROM fleetloop.pool_1m")[0][0] >= 1
            and worker.sql("SELECT count() FROM fleetloop.serving_metrics")[0][0] >= 200
        ),
        what="a minute of rollups",
        proc=sim,
    )
    until(
        lambda: (
            worker.sql("SELECT count() FROM fleetloop.decisions WHERE controller = 'capacity'")[0][
                0
            ]
            >= 1
        ),
        what="the capacity controller's first budget",
        proc=sim,
    )

    dom = _render(worker.url + "/dashboards")
    panels = [p for d in load_dashboards() for p in d.panels]
    assert "fleetloop: fleet overview" in dom
    for panel in panels:
        assert panel.title in dom, panel.title
    charts = sum(p.kind == "timeseries" for p in panels)
    # every chart drew at least one line (or, in its first minute, one dot per series)
    assert dom.count("<polyline") + dom.count('class="dot"') >= charts
    assert "no data yet" not in dom and 'class="err"' not in dom
    assert "rack-0000 draw" in dom and "rack-0000 limit" in dom  # the power chart's series
    assert "qwen-7b demanded" in dom and "us-east-h100" in dom
    assert "node-00002-gpu1" in dom and "page_test" in dom and "applied" in dom  # the command
