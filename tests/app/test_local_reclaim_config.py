"""`[cloud]`'s local reclaim settings reach the local cloud: rates, trace files (relative to
the configuration), the seed, the notice window and poll; wrong values are refused with
the field named."""

from __future__ import annotations

import json

import pytest

from app.config import load_cluster_config
from app.wiring import local_cloud
from autoscaler.availability import AvailabilityTrace
from autoscaler.errors import InputError

SETTINGS = """emulate_delays = false
reclaim_rates = { "c7i.large:spot" = 0.5 }
reclaim_traces = { "c7i.xlarge:spot@local" = "traces/c7i.json" }
reclaim_seed = 7
notice_window_s = 20.0
notice_poll_s = 0.5
"""


def configure(cluster_dir, settings: str):
    path = cluster_dir / "autoscaler.toml"
    text = path.read_text()
    line = next(line for line in text.splitlines() if line.startswith("emulate_delays"))
    path.write_text(text.replace(line, settings.rstrip("\n"), 1))
    return path


def test_the_local_clouds_reclaims_come_from_the_cloud_table(cluster_dir):
    (cluster_dir / "traces").mkdir()
    (cluster_dir / "traces" / "c7i.json").write_text(
        json.dumps({"metadata": {"gap_seconds": 600}, "data": [0, 1]})
    )
    config = load_cluster_config(configure(cluster_dir, SETTINGS))
    cloud = local_cloud(config)
    try:
        plan = cloud.reclaims
        assert plan.rates_per_hour == {"c7i.large:spot": 0.5}
        assert plan.traces == {"c7i.xlarge:spot@local": AvailabilityTrace(600.0, (0, 1))}
        assert plan.seed == 7
        assert (cloud.notice_window_s, cloud.notice_poll_s) == (20.0, 0.5)
        # The traces' epoch is kept beside the cloud: a restarted daemon reads the same one.
        assert local_cloud(config).reclaims.epoch_s == plan.epoch_s
    finally:
        cloud.close()


def test_a_negative_rate_is_refused_naming_it(cluster_dir):
    path = configure(cluster_dir, 'reclaim_rates = { "c7i.large:spot" = -1.0 }')
    with pytest.raises(InputError, match="reclaim_rates"):
        load_cluster_config(path)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        # The same file reader as every other input: duplicate keys are refused ...
        (
            '{"metadata": {"gap_seconds": 600}, "data": [0], "data": [1]}',
            "key 'data' appears twice",
        ),
        # ... and the sample at fault is named with its value.
        ('{"metadata": {"gap_seconds": 600}, "data": [0, 0, 3]}', "field 'data[2]' = 3"),
    ],
)
def test_a_bad_trace_file_of_the_local_cloud_is_refused_naming_it(cluster_dir, text, named):
    (cluster_dir / "traces").mkdir()
    (cluster_dir / "traces" / "c7i.json").write_text(text)
    config = load_cluster_config(configure(cluster_dir, SETTINGS))
    with pytest.raises(InputError) as refused:
        local_cloud(config)
    line = str(refused.value)
    assert "c7i.json" in line and named in line and "\n" not in line
