"""The web dashboard the daemon serves (`[dashboard]` in the cluster's configuration).

- `server`: the Starlette app and the uvicorn thread; login, sessions, roles,
  CSRF and the audit log, every JSON endpoint run as a submission API method.
- `sessions`: opaque server-side browser sessions and their CSRF tokens.
- `views`: what each page shows, built on `app.reports` (the same documents
  `autoscaler status`, `jobs`, `job` and `cost-report` print).
- `pages`: the HTML skeletons and the list of JSON endpoints (`GET /api`).
- `static/`: the pages' script and style, and uPlot (vendored, MIT) for charts.
"""
