"""What the daemon says as it starts: its own events, not its libraries' chatter."""

from __future__ import annotations

import logging

from app.config import load_cluster_config
from app.daemon import configure_logging
from app.init import init_cluster
from app.wiring import open_state


def test_the_daemons_log_starts_without_the_migration_tools_lines(tmp_path, capfd, monkeypatch):
    # Re-enabled: a library's logging.config call in an earlier test of this process
    # (import-linter's) disables the loggers that existed then.
    monkeypatch.setattr(logging.getLogger("autoscaler.daemon"), "disabled", False)
    init_cluster(tmp_path, name="quiet", local=True)
    config = load_cluster_config(tmp_path / "autoscaler.toml")
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {n: logging.getLogger(n).level for n in ("alembic", "alembic.runtime.migration")}
    try:
        configure_logging()
        logging.getLogger("autoscaler.daemon").info('{"event": "leading"}')
        open_state(config, create=True).close()  # creates the schema: Alembic's INFO lines
        err = capfd.readouterr().err
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, old in levels.items():
            logging.getLogger(name).setLevel(old)
    assert '"event": "leading"' in err  # the daemon's own lines get through
    assert "alembic" not in err and "Context impl" not in err, err
