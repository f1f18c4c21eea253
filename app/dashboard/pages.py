"""The dashboard's HTML: one skeleton per page, filled by `static/dashboard.js` from the
JSON endpoints (the same ones scripts use), and the login form.

The skeleton carries who is logged in, their role and the session's CSRF token
as data attributes (no inline script: the Content-Security-Policy forbids it);
buttons that change something are drawn only for roles that may press them,
and the server refuses them for the others anyway.
"""

from __future__ import annotations

from html import escape

#: Page name -> its path (a job's page is `/jobs/<id>`).
PAGES = {"now": "/now", "jobs": "/jobs", "spend": "/spend", "decisions": "/decisions"}

_TITLES = {
    "now": "Now",
    "jobs": "Jobs",
    "job": "Job",
    "spend": "Spend",
    "decisions": "Decisions",
}

#: The JSON endpoints: (HTTP method, path, the API method it runs as, what it returns).
ENDPOINTS = (
    ("GET", "/api/status", "ClusterStatus", "`autoscaler status --json`"),
    (
        "GET",
        "/api/now",
        "ClusterStatus",
        "the status document plus each instance's tasks with measured throughput, its "
        "capacity type, the last round's $/h beside no packing and the LP bound, and each "
        "guardrail's headroom",
    ),
    (
        "GET",
        "/api/jobs?status=S&limit=N",
        "ListJobs",
        "`autoscaler jobs --json` plus each job's attributed cost so far and expected, and "
        "the spend by user and by team",
    ),
    ("GET", "/api/jobs/ID", "GetJob", "`autoscaler job ID --json` plus its timeline"),
    ("GET", "/api/jobs/ID/logs?tail=N", "GetLogs", "`autoscaler logs ID --tail N --json`"),
    ("POST", "/api/jobs/ID/cancel", "CancelJob", "cancels the job (owner or admin)"),
    (
        "POST",
        "/api/instances/ID/drain",
        "DrainInstance",
        "drains the instance (admin, or a submitter whose jobs alone run there); the form "
        "field `job` moves only that job's tasks off it",
    ),
    ("GET", "/api/cost-report?since=T", "CostReport", "`autoscaler cost-report --json`"),
    (
        "GET",
        "/api/spend?since=T",
        "CostReport",
        "the cost report and the series the Spend charts draw: the ledger's $/h and "
        "cumulative $ at every change, each round's planned $/h, no-packing $/h and LP bound",
    ),
    (
        "GET",
        "/api/what-if",
        "CostReport",
        "the last week replayed under the other schedulers (`cost-report --what-if`)",
    ),
    (
        "GET",
        "/api/decisions?kind=K&outcome=O&chosen=C&q=TEXT&limit=N",
        "Decisions",
        "the decision log, newest round first, filtered",
    ),
)


def page(
    name: str, *, cluster: str, user: str, role: str, csrf: str, poll_ms: int, subject: str = ""
) -> str:
    """The skeleton of page `name` for a logged-in user."""
    nav = "".join(
        f'<a href="{path}"{" class=current" if n == name else ""}>{_TITLES[n]}</a>'
        for n, path in PAGES.items()
    )
    title = _TITLES[name] + (f" {subject}" if subject else "")
    attrs = {
        "data-page": name,
        "data-user": user,
        "data-role": role,
        "data-csrf": csrf,
        "data-poll-ms": str(poll_ms),
        "data-subject": subject,
    }
    body_attrs = " ".join(f'{k}="{escape(v, quote=True)}"' for k, v in attrs.items())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)} · {escape(cluster)}</title>
<link rel="stylesheet" href="/static/uPlot.min.css">
<link rel="stylesheet" href="/static/dashboard.css">
</head>
<body {body_attrs}>
<header><span class="brand">{escape(cluster)}</span><nav>{nav}</nav>
<span class="who">{escape(user)} ({escape(role)})
<form method="post" action="/logout"><input type="hidden" name="csrf" value="{escape(csrf)}">
<button type="submit">Log out</button></form></span></header>
<main id="main"><h1>{escape(title)}</h1><p class="muted" id="updated">loading…</p>
<div id="content"></div></main>
<script src="/static/uPlot.iife.min.js"></script>
<script src="/static/dashboard.js"></script>
</body></html>
"""


def login_page(cluster: str, error: str = "") -> str:
    """The login form: a user's API token (`autoscaler user add` prints it once)."""
    problem = f'<p class="error" id="login-error">{escape(error)}</p>' if error else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Log in · {escape(cluster)}</title>
<link rel="stylesheet" href="/static/dashboard.css">
</head>
<body class="login"><main>
<h1>{escape(cluster)}</h1>
<form method="post" action="/login">
<label for="token">API token</label>
<input id="token" name="token" type="password" autocomplete="off" required>
<button type="submit" id="login">Log in</button>
</form>{problem}
<p class="muted">A user's token, from <code>autoscaler user add NAME --role read</code>
(or the cluster's <code>secrets/api.token</code>).</p>
</main></body></html>
"""
