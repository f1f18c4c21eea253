"""The daemon (`app.daemon.Daemon`, as `autoscaler daemon` builds it from a cluster's file)
driving the simulated world instead of agents on this host: its rounds, steps, metrics and
notifications are the production code's, on a virtual clock, in a second."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from app.bundled import bundled
from app.config import load_cluster_config
from app.daemon import Bindings, Daemon
from app.files import load_catalog
from app.init import init_cluster
from app.wiring import open_state
from autoscaler.jobs import JobSpec
from simulator.engine import EventLoop
from simulator.world import SimulatedCloud, SimulatedExecutor, World
from tests.app.conftest import DirStorage
from tests.simulator.test_hand_computed import NO_INTERFERENCE, catalog


class SimulatedDaemon:
    """A cluster directory (`autoscaler init --local`, its file changed by `edits` and
    followed by `extra` TOML), its daemon, and
    the simulated world it drives; `until(t)` moves the world, the daemon stepping after
    every batch of events as its scheduler would."""

    def __init__(
        self,
        root: Path,
        jobs: Sequence[JobSpec],
        extra: str = "",
        edits: Mapping[str, str] | None = None,
    ) -> None:
        init_cluster(root, name="test", local=True)
        path = root / "autoscaler.toml"
        metrics = load_cluster_config(path).metrics.listen  # init's choice: 9464 or the next
        text = path.read_text().replace(f'listen = "{metrics}"', 'listen = ""')
        for old, new in (edits or {}).items():
            assert old in text, old
            text = text.replace(old, new)
        path.write_text(text + "\n" + extra)
        self.config = load_cluster_config(path)
        self.engine = EventLoop()
        self.world = World(self.engine, catalog(), NO_INTERFERENCE, jobs)
        self.store = open_state(self.config, create=True)
        bundled_catalog = load_catalog(bundled("ec2_config.json"))
        self.daemon = Daemon(
            self.config,
            Bindings(
                store=self.store,
                cloud=SimulatedCloud(self.world),
                executor=SimulatedExecutor(self.world),
                storage=DirStorage(root / "storage"),
                catalog=lambda: bundled_catalog,
            ),
            clock=self.engine,
        )
        for job in jobs:
            self.store.submit_job(job, owner="alice", at=0.0)
        self.engine.after_batch = self.daemon.step

    def until(self, t: float) -> None:
        """Run the world's events up to time t (inclusive)."""
        self.engine.at(t, lambda: None)
        self.engine.run(until=lambda: self.engine.now() >= t)

    def close(self) -> None:
        self.store.close()
