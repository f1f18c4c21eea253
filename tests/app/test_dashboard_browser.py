"""The dashboard in a real browser: Debian's Chromium, headless, driven by Playwright.

First against the dashboard served over HTTPS in this process (login, a wrong
token, a reader without cancel buttons, a chart drawn with data), then against
the whole system: `autoscaler init --local`, the daemon serving the dashboard,
an example submitted through the command line and watched on the Jobs page
until it completes.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.dashboard.server import DashboardServer
from tests.app.conftest import free_port
from tests.app.test_dashboard import _history, web  # noqa: F401 (fixture)
from tests.executor.conftest import docker_client, python_image  # noqa: F401 (fixtures)

CHROMIUM = Path("/usr/bin/chromium")

pytestmark = [
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="no /usr/bin/chromium (apt-get install chromium)"
    ),
    pytest.mark.timeout(600),
    pytest.mark.long,
]

sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with sync_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def served(web) -> Iterator[str]:  # noqa: F811
    config = web.api.config
    listen = f"127.0.0.1:{free_port()}"
    server = DashboardServer(
        web.dashboard, listen, config.secrets.server_cert, config.secrets.server_key
    )
    server.start()
    try:
        yield f"https://{listen}"
    finally:
        server.stop()


def _page(browser):
    # The cluster's CA is private and Chromium keeps its own trust store: the certificate
    # is checked against the CA below, with Python's ssl, not by the browser.
    return browser.new_context(ignore_https_errors=True).new_page()


def _log_in(page, base: str, token: str) -> None:
    page.goto(f"{base}/login")
    page.fill("#token", token)
    page.click("#login")


def test_the_dashboard_is_served_with_the_clusters_certificate(web, served):  # noqa: F811
    host, port = served.removeprefix("https://").split(":")
    context = ssl.create_default_context(cafile=str(web.api.config.secrets.ca_cert))
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
    other = ssl.create_default_context()  # the system's CAs do not vouch for it
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        other.wrap_socket(raw, server_hostname=host)


def test_a_wrong_token_is_refused_in_the_browser(web, served, browser):  # noqa: F811
    page = _page(browser)
    _log_in(page, served, web.admin[:-3] + "xyz")
    assert page.locator("#login-error").inner_text() == "That token was refused."
    page.goto(f"{served}/jobs")
    assert page.url == f"{served}/login"  # no session: back to the login form
    page.context.close()


def test_a_reader_sees_jobs_but_no_cancel_or_drain_button(web, served, browser):  # noqa: F811
    _history(web.api)
    page = _page(browser)
    _log_in(page, served, web.reader)
    page.goto(f"{served}/jobs")
    page.wait_for_selector("#jobs [data-job-status='a']")
    assert page.locator("#jobs [data-job-status='a']").inner_text() == "queued"
    assert page.locator("button.cancel").count() == 0
    page.goto(f"{served}/now")
    page.wait_for_selector("#instances")
    assert page.locator("button.drain").count() == 0
    page.context.close()
    admin = _page(browser)
    _log_in(admin, served, web.admin)
    admin.goto(f"{served}/jobs")
    admin.wait_for_selector("button.cancel[data-job='a']")  # the same page, for an admin
    admin.on("dialog", lambda dialog: dialog.accept())
    admin.click("button.cancel[data-job='a']")
    admin.wait_for_selector("#jobs [data-job-status='a']:has-text('cancelled')")
    assert web.api.store.job("a").status == "cancelled"
    admin.context.close()


def test_the_spend_chart_is_drawn_with_data(web, served, browser):  # noqa: F811
    _history(web.api)
    page = _page(browser)
    _log_in(page, served, web.reader)
    page.goto(f"{served}/spend")
    canvas = page.wait_for_selector("#chart-hourly canvas")
    # Pixels drawn that are not the background: the series, not only an empty frame.
    painted = page.evaluate(
        """(canvas) => {
            const ctx = canvas.getContext('2d');
            const data = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
            let n = 0;
            for (let i = 0; i < data.length; i += 4) {
                const grey = data[i] === data[i + 1] && data[i + 1] === data[i + 2];
                if (data[i + 3] > 0 && !grey) n++;
            }
            return n;
        }""",
        canvas,
    )
    assert painted > 100  # coloured series strokes (the axes and grid are grey)
    assert page.locator("#spend-total .value").inner_text() != "—"
    page.context.close()


# -- the whole system -------------------------------------------------------------------------


def test_a_job_submitted_through_the_cli_appears_progresses_and_completes_on_the_jobs_page(
    tmp_path,
    browser,
    python_image,  # noqa: F811 (the example builds FROM it)
    docker_client,  # noqa: F811
):
    import uuid

    from executor.security import read_token
    from tests.e2e.harness import (
        PATIENCE_S,
        Daemon,
        cli,
        cli_json,
        copy_example,
        local_cluster,
        until,
    )

    name = f"dash-{uuid.uuid4().hex[:6]}"
    config = local_cluster(tmp_path / "cluster", name, interval_s="3", step_s="1")
    assert config.dashboard.enabled  # `init --local` turns it on
    job_file = copy_example("train", tmp_path / "jobs", {"TOTAL": "400"})  # 20 s alone
    at = ("--config", str(config.path))
    base = f"https://{config.dashboard.listen}"
    wait_ms = PATIENCE_S * 1000
    daemon = Daemon(config.path)
    try:
        daemon.wait_serving()
        # The API serves first, the dashboard a moment later: its own event says when.
        until("the dashboard to serve", lambda: daemon.events("dashboard"), daemon=daemon)
        page = _page(browser)
        _log_in(page, base, read_token(config.secrets.api_token))
        page.goto(f"{base}/jobs")
        page.wait_for_selector("#updated:has-text('updated')")
        assert page.locator("#jobs tbody tr").count() == 0
        [job_id] = cli_json("submit", str(job_file), *at)["jobs"]
        status = f"#jobs [data-job-status='{job_id}']"
        page.wait_for_selector(status, timeout=60_000)  # appears without a reload
        page.wait_for_function(
            """(id) => {
                const cell = document.querySelector(`[data-job-progress='${id}']`);
                return cell && Number(cell.textContent.replace(/,/g, '')) > 0;
            }""",
            arg=job_id,
            timeout=wait_ms,
        )
        assert page.locator(status).inner_text() == "running"
        page.wait_for_selector(f"{status}:has-text('completed')", timeout=wait_ms)
        assert page.locator(f"[data-job-progress='{job_id}']").inner_text() == "400"
        assert cli_json("job", job_id, *at)["status"] == "completed"
        page.goto(f"{base}/jobs/{job_id}")
        page.wait_for_selector("#timeline")
        assert "placed" in page.locator("#timeline").inner_text()
        page.context.close()
        assert daemon.stop() == 0
    finally:
        daemon.kill()
        code, out = cli("down", "--yes", *at)
    assert code == 0, out
