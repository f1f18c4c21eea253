"""One daemon acts per cluster: the leader lock on SQLite and on PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import threading

from app.leader import LeaderLock
from state.database import create_state_engine


def test_a_second_daemon_cannot_lead_until_the_first_lets_go(db_url):
    first_engine, second_engine = create_state_engine(db_url), create_state_engine(db_url)
    first, second = LeaderLock(first_engine, "c1"), LeaderLock(second_engine, "c1")
    other_cluster = LeaderLock(second_engine, "c2")
    try:
        assert first.try_acquire()
        assert not second.try_acquire()
        assert other_cluster.try_acquire()  # another cluster in the same database is not held
        messages: list[str] = []
        stop = threading.Event()
        stop.set()  # give up at once: it must say why it waits, then return
        assert not second.acquire(stop, on_wait=messages.append)
        assert messages == [] or "another daemon leads cluster c1" in messages[0]
        first.release()
        assert second.try_acquire()
    finally:
        for lock in (first, second, other_cluster):
            lock.release()
        first_engine.dispose()
        second_engine.dispose()


def test_a_waiting_daemon_says_so_once_and_takes_over_when_the_leader_dies(db_url, tmp_path):
    # The leader is another process holding the lock; it is killed with SIGKILL.
    script = tmp_path / "leader.py"
    script.write_text(
        "import sys, time\n"
        "from state.database import create_state_engine\n"
        "from app.leader import LeaderLock\n"
        f"lock = LeaderLock(create_state_engine({db_url!r}), 'c1')\n"
        "assert lock.try_acquire()\n"
        "print('leading', flush=True)\n"
        "time.sleep(600)\n"
    )
    leader = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    engine = create_state_engine(db_url)
    lock = LeaderLock(engine, "c1")
    try:
        assert leader.stdout.readline().strip() == "leading"
        messages: list[str] = []
        stop = threading.Event()
        waiting = threading.Thread(
            target=lambda: messages.append(
                "led" if lock.acquire(stop, poll_s=0.05, on_wait=messages.append) else "gave up"
            )
        )
        waiting.start()
        deadline = threading.Event()
        while not messages and not deadline.wait(0.05):
            pass
        assert "another daemon leads cluster c1" in messages[0]
        leader.kill()  # SIGKILL: no clean release
        leader.wait(timeout=30)
        waiting.join(timeout=60)
        assert messages[-1] == "led" and len(messages) == 2  # said once, then led
    finally:
        stop.set()
        leader.kill()
        lock.release()
        engine.dispose()


def test_down_refuses_while_a_daemon_leads_and_runs_once_it_stopped(cluster_dir, capsys):
    from app.cli import main
    from app.config import load_cluster_config
    from app.wiring import open_state

    config = load_cluster_config(cluster_dir / "autoscaler.toml")
    store = open_state(config, create=True)
    daemon = LeaderLock(store.engine, config.cluster.name)
    args = ["down", "--yes", "--config", str(config.path)]
    try:
        assert daemon.try_acquire()
        assert main(args) == 2
        err = capsys.readouterr().err
        assert "a daemon is running for cluster 'test'" in err and "\n" not in err.strip()
        daemon.release()
        assert main(args) == 0
        assert "terminated 0 instance(s)" in capsys.readouterr().out
        assert daemon.try_acquire()  # down let go of the lock
    finally:
        daemon.release()
        store.close()
