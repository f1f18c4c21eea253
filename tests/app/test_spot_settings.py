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
        + "max_reclaims = 0\nmax_delay_share = 0.2\nmax_lost_share = 0\n"
        + '[spot.bands]\n"p3.2xlarge" = ">20%"\n'
    )
    config = load_cluster_config(path)
    policy = config.control_options().spot
    assert policy is not None
    got = (policy.checkpoint_every_s, policy.max_reclaims)
    assert (*got, policy.max_delay_share, policy.max_lost_share) == (600.0, None, 0.2, 0.0)
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


def spot_cluster(tmp_path, table: str):
    """A local cluster's file with `table` appended (`[spot]`, or more of `[ec2]`)."""
    main(["init", "--dir", str(tmp_path), "--local", "--name", "c1"])
    path = tmp_path / "autoscaler.toml"
    path.write_text(path.read_text() + table)
    return path


def test_spot_types_give_spot_offerings_to_those_types_alone(tmp_path):
    from app.wiring import offline_catalog
    from provisioners.catalog import bundled_spot_snapshot
    from provisioners.config import family_of

    path = spot_cluster(tmp_path, "")
    on_demand = offline_catalog(load_cluster_config(path))
    snapshot = bundled_spot_snapshot(on_demand.region or "us-east-1")
    assert snapshot is not None
    priced = sorted(t.name for t in on_demand if snapshot.prices.get(t.name))
    families = sorted({family_of(name) for name in priced})
    assert len(families) >= 2, "the test needs two priced families"
    single = next(n for n in priced if family_of(n) == families[1])
    path.write_text(
        path.read_text() + f'\n[spot]\nenabled = true\ntypes = ["{families[0]}", "{single}"]\n'
    )
    config = load_cluster_config(path)
    catalog = offline_catalog(config)
    expected = {n for n in priced if family_of(n) == families[0]} | {single}
    assert {t.name for t in catalog if t.is_spot} == {f"{n}:spot" for n in expected}
    # The launch path reads the same setting: every spot offering the planner may pick
    # launches, and no other type may launch as spot.
    ec2 = config.provisioner.ec2
    assert ec2.spot_enabled and ec2.spot_types == (families[0], single)
    assert {n for n in priced if ec2.spot_for(n)} == expected


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ('\n[spot]\nenabled = true\ntypes = ["m5"]\n', ["[spot]", "types", "'m5'", "[ec2] allows"]),
        ('\n[spot]\nenabled = true\ntypes = ["c7i.large", "c7i.large"]\n', ["repeat"]),
        ('\n[spot]\nenabled = true\ntypes = ["c7i.huge"]\n', ["[spot]", "types", "c7i.huge"]),
    ],
)
def test_a_spot_type_that_can_get_no_spot_offering_is_refused_in_one_line(
    tmp_path, capsys, table, words
):
    path = spot_cluster(tmp_path, table)
    capsys.readouterr()
    # `c7i.huge` passes the file's checks (its family is allowed) and is refused where the
    # catalog is made: no priced type matches it.
    assert main(["cost-report", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and all(w in err for w in words), err


def test_the_old_ec2_spot_list_is_refused_in_a_clusters_file(tmp_path, capsys):
    main(["init", "--dir", str(tmp_path), "--local", "--name", "c1"])
    path = tmp_path / "autoscaler.toml"
    text = path.read_text()
    assert "\n[ec2]\n" in text
    path.write_text(text.replace("\n[ec2]\n", '\n[ec2]\nspot = ["c7i"]\n', 1))
    capsys.readouterr()
    assert main(["catalog", "show", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "[ec2]" in err and "'spot'" in err and "[spot] enabled" in err


def test_an_ec2_cloud_plans_with_the_spot_offerings_its_launches_allow(tmp_path):
    # EC2 lists on-demand types only; the cluster's EC2 binding must offer the spot
    # offerings `[spot]` admits beside them, or `[spot] enabled` would plan nothing on spot.
    from app.wiring import _cloud
    from provisioners.catalog import cached_or_bundled_catalog

    main(["init", "--dir", str(tmp_path), "--name", "c1", "--bucket", "my-bucket"])
    path = tmp_path / "autoscaler.toml"
    ready = (
        '[ec2]\nsubnet_ids = ["subnet-0123456789abcdef0"]\n'
        'security_group_ids = ["sg-0123456789abcdef0"]\n'
    )
    text = path.read_text().replace("[ec2]\n", ready, 1)
    path.write_text(text + '\n[spot]\nenabled = true\ntypes = ["c7i"]\n')
    config = load_cluster_config(path)
    cloud = _cloud(config)  # no AWS call: the catalog is the cached or bundled one
    cloud.ec2_catalog = lambda: cached_or_bundled_catalog(config.provisioner.ec2)
    cloud.spot_prices = lambda: None  # EC2's live prices: tests/provisioners, on moto
    listed = cloud.ec2_catalog().catalog
    catalog = cloud.catalog()
    spot = [t for t in catalog if t.is_spot]
    assert spot and {t.launch_type.split(".")[0] for t in spot} == {"c7i"}
    assert {t.name for t in catalog if not t.is_spot} == {t.name for t in listed}
    assert all(t.hourly_cost < listed[t.launch_type].hourly_cost for t in spot)


def test_ec2s_spot_prices_in_force_price_the_offerings_they_name(tmp_path):
    from app.wiring import with_spot
    from provisioners.catalog import bundled_spot_snapshot, cached_or_bundled_catalog
    from provisioners.spot_prices import SpotPriceTable

    main(["init", "--dir", str(tmp_path), "--name", "c1", "--bucket", "my-bucket"])
    path = tmp_path / "autoscaler.toml"
    path.write_text(
        path.read_text() + '\n[spot]\nenabled = true\nzones = ["use1-az1", "use1-az2"]\n'
    )
    config = load_cluster_config(path)
    listed = cached_or_bundled_catalog(config.provisioner.ec2).catalog
    snapshot = bundled_spot_snapshot(listed.region or "us-east-1")
    assert snapshot is not None
    bundled = with_spot(config, listed)
    old = snapshot.prices["c7i.large"]["use1-az1"]
    live = SpotPriceTable("us-east-1", {"c7i.large": {"use1-az1": old / 2}}, 1.8e9)
    priced = with_spot(config, listed, live)
    assert priced["c7i.large:spot@use1-az1"].hourly_cost == old / 2
    assert bundled["c7i.large:spot@use1-az1"].hourly_cost == old
    # what EC2 did not price keeps the snapshot's price
    for name in ("c7i.large:spot@use1-az2", "r7i.large:spot@use1-az1"):
        assert priced[name].hourly_cost == bundled[name].hourly_cost


def test_a_regional_spot_offering_is_priced_by_ec2_over_the_zones_the_cluster_launches_in(
    tmp_path,
):
    """Without `[spot] zones`, a type's one offering is priced at the median of its zones'
    prices: of the zones EC2 priced for this cluster (its subnets') when it did, not of
    the snapshot's other zones, whose dated prices the ledger would bill otherwise."""
    import statistics

    from app.wiring import with_spot
    from provisioners.catalog import bundled_spot_snapshot, cached_or_bundled_catalog
    from provisioners.spot_prices import SpotPriceTable

    main(["init", "--dir", str(tmp_path), "--name", "c1", "--bucket", "my-bucket"])
    path = tmp_path / "autoscaler.toml"
    path.write_text(path.read_text() + "\n[spot]\nenabled = true\n")
    config = load_cluster_config(path)
    listed = cached_or_bundled_catalog(config.provisioner.ec2).catalog
    snapshot = bundled_spot_snapshot(listed.region or "us-east-1")
    assert snapshot is not None
    bundled = snapshot.prices["c7i.large"]
    assert len(bundled) >= 3
    ours = sorted(bundled)[:2]  # the cluster's subnets are in two of its zones
    fresh = {zone: bundled[zone] * 3 for zone in ours}  # prices rose since the snapshot
    live = SpotPriceTable("us-east-1", {"c7i.large": fresh}, 1.8e9)
    priced = with_spot(config, listed, live)
    assert priced["c7i.large:spot"].hourly_cost == pytest.approx(statistics.median(fresh.values()))
    # Without EC2's prices, or for a type it did not price: the snapshot's median.
    assert with_spot(config, listed)["c7i.large:spot"].hourly_cost == pytest.approx(
        statistics.median(bundled.values())
    )
    r7i = snapshot.prices["r7i.large"]
    assert priced["r7i.large:spot"].hourly_cost == pytest.approx(statistics.median(r7i.values()))


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("reclaim_alpha = 0", "field 'reclaim_alpha' = 0: must be a number > 0"),
        ("reclaim_alpha = 1.5", "field 'reclaim_alpha' = 1.5: must be a number < 1"),
        ('reclaim_alpha = "x"', "field 'reclaim_alpha' = 'x': must be a number"),
        ("max_reclaims = -1", "field 'max_reclaims' = -1: must be a whole number >= 0"),
        ("max_lost_share = 1", "field 'max_lost_share' = 1: must be a number < 1"),
        ("max_lost_share = -0.1", "field 'max_lost_share' = -0.1: must be a number >= 0"),
        ("max_delay_share = 1", "field 'max_delay_share' = 1: must be a number < 1"),
        ('max_delay_share = "5%"', "field 'max_delay_share' = '5%': must be a number"),
    ],
)
def test_a_bad_reclaim_setting_is_one_line_naming_file_field_and_value(
    tmp_path, capsys, line, says
):
    main(["init", "--dir", str(tmp_path), "--local", "--name", "c1"])
    path = tmp_path / "autoscaler.toml"
    path.write_text(path.read_text() + f"\n[spot]\nenabled = true\n{line}\n")
    capsys.readouterr()
    assert main(["status", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert str(path) in err and "[spot]" in err and says in err


def test_the_reclaim_test_level_reaches_the_policy(tmp_path):
    main(["init", "--dir", str(tmp_path), "--local", "--name", "c1"])
    path = tmp_path / "autoscaler.toml"
    path.write_text(path.read_text() + "\n[spot]\nenabled = true\nreclaim_alpha = 0.05\n")
    policy = load_cluster_config(path).control_options().spot
    assert policy is not None
    shares = (policy.max_delay_share, policy.max_lost_share)
    assert (policy.reclaim_alpha, policy.max_reclaims, *shares) == (0.05, 10, 0.05, 0.015)
