"""Spot settings where users give them: a job file's capacity and deadline, and the
cluster file's `[spot]` table."""

from __future__ import annotations

import pytest

from app.bundled import bundled
from app.cli import main
from app.config import load_cluster_config
from app.files import load_catalog
from app.jobfile import load_job_file
from autoscaler.errors import InputError

JOB = """
name = "train"
{extra}

[tasks.node0]
image = "python:3.11"
command = ["python", "-c", "print(1)"]
demand = {{ any = [0, 1, 2] }}
"""


def submit(tmp_path, extra: str):
    path = tmp_path / "job.toml"
    path.write_text(JOB.format(extra=extra))
    return load_job_file(path, load_catalog(bundled("ec2_config.json"))).job


def test_a_job_file_says_its_capacity_and_deadline(tmp_path):
    job = submit(tmp_path, 'capacity = "on-demand"\ndeadline_s = 7200')
    assert (job.capacity, job.deadline_s, job.max_jct_factor) == ("on-demand", 7200.0, None)
    default = submit(tmp_path, "max_jct_factor = 1.5")
    assert (default.capacity, default.deadline_s, default.max_jct_factor) == ("auto", None, 1.5)


@pytest.mark.parametrize(
    "extra",
    [
        'capacity = "reserved"',
        "deadline_s = 0",
        "max_jct_factor = 0.5",
        "deadline_s = 60\nmax_jct_factor = 2",
    ],
)
def test_a_bad_capacity_or_deadline_is_refused(tmp_path, extra):
    with pytest.raises(InputError):
        submit(tmp_path, extra)


def test_the_spot_table_gives_the_round_its_spot_policy(tmp_path):
    main(["init", "--dir", str(tmp_path), "--local", "--name", "c1"])
    path = tmp_path / "autoscaler.toml"
    assert load_cluster_config(path).control_options().spot is None  # off unless enabled
    path.write_text(
        path.read_text()
        + '\n[spot]\nenabled = true\nzones = ["use1-az1"]\ncheckpoint_every_s = 600\n'
        + 'max_reclaims = 0\n[spot.bands]\n"p3.2xlarge" = ">20%"\n'
    )
    config = load_cluster_config(path)
    policy = config.control_options().spot
    assert policy is not None
    assert (policy.checkpoint_every_s, policy.max_reclaims) == (600.0, None)
    assert config.spot.zones == ("use1-az1",) and config.spot.bands == {"p3.2xlarge": ">20%"}


def test_an_unknown_band_is_refused(tmp_path):
    main(["init", "--dir", str(tmp_path), "--local", "--name", "c1"])
    path = tmp_path / "autoscaler.toml"
    path.write_text(path.read_text() + '\n[spot.bands]\n"p3.2xlarge" = "often"\n')
    with pytest.raises(InputError, match="spot"):
        load_cluster_config(path)


def test_an_enabled_spot_table_puts_spot_offerings_in_the_clusters_catalog(tmp_path):
    from app.wiring import offline_catalog
    from provisioners.catalog import bundled_spot_snapshot

    main(["init", "--dir", str(tmp_path), "--local", "--name", "c1"])
    path = tmp_path / "autoscaler.toml"
    on_demand = offline_catalog(load_cluster_config(path))
    assert not any(t.is_spot for t in on_demand)  # off unless enabled
    path.write_text(path.read_text() + "\n[spot]\nenabled = true\n")
    catalog = offline_catalog(load_cluster_config(path))
    snapshot = bundled_spot_snapshot(on_demand.region or "us-east-1")
    assert snapshot is not None
    spot = {t.name: t for t in catalog if t.is_spot}
    priced = {t.name for t in on_demand if snapshot.prices.get(t.name)}
    assert set(spot) == {f"{name}:spot" for name in priced} and priced
    for name in priced:  # each beside its on-demand type: cheaper, same capacity, a risk
        offering = spot[f"{name}:spot"]
        assert offering.launch_type == name
        assert offering.capacity == on_demand[name].capacity
        assert 0 < offering.hourly_cost < on_demand[name].hourly_cost
        assert offering.interruption_per_hour > 0


def test_a_client_reads_the_catalog_of_a_daemon_with_spot_offerings(tmp_path):
    # The CLI checks a job file against the daemon's catalog (`GetCatalog`): spot
    # offerings' names are not type names, and must not make it unreadable.
    from app.api import catalog_document
    from app.wiring import offline_catalog
    from provisioners.catalog import catalog_from_document

    main(["init", "--dir", str(tmp_path), "--local", "--name", "c1"])
    path = tmp_path / "autoscaler.toml"
    path.write_text(path.read_text() + "\n[spot]\nenabled = true\n")
    catalog = offline_catalog(load_cluster_config(path))
    assert any(t.is_spot for t in catalog)
    served = catalog_from_document(catalog_document(catalog), source="the daemon's catalog")
    assert {t.name for t in served} == {t.name for t in catalog if not t.is_spot}
