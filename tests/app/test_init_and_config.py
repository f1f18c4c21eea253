"""`autoscaler init` and the cluster configuration it writes."""

from __future__ import annotations

import os
import stat

import pytest
from cryptography import x509

from app.cli import main
from app.config import load_cluster_config
from app.init import init_cluster
from autoscaler.decide import WaitPolicy
from autoscaler.errors import InputError
from autoscaler.fairshare import TeamLimits
from executor.security import Authority, certificate_names, issued_by

SECRETS = (
    "server-ca.pem",
    "server-ca.key",
    "server.pem",
    "server.key",
    "worker-ca.pem",
    "worker-ca.key",
    "api.token",
)


def test_init_writes_a_configuration_that_loads_and_secrets_only_the_owner_reads(tmp_path, capsys):
    assert main(["init", "--dir", str(tmp_path), "--name", "lab-7"]) == 0
    config = load_cluster_config(tmp_path / "autoscaler.toml")
    assert config.cluster.name == "lab-7" and config.cloud.provider == "ec2"
    assert config.provisioner.ec2.cluster_id == "lab-7"  # said once, in [cluster]
    assert config.storage.url == "s3://REPLACE-WITH-YOUR-BUCKET/lab-7"
    rails = config.control_options().guardrails
    assert rails.max_hourly_spend is not None and rails.max_instances is not None  # safe limits
    assert config.provisioner.ec2.dry_run  # a first run launches nothing
    for name in SECRETS:
        mode = stat.S_IMODE(os.stat(tmp_path / "secrets" / name).st_mode)
        assert mode == 0o600, name
    token = (tmp_path / "secrets" / "api.token").read_text()
    assert token not in capsys.readouterr().out  # never printed
    assert not (tmp_path / "secrets" / "worker.token").exists()  # no shared worker secret
    # The daemon's certificate is the server CA's, for the name clients verify and the host
    # they dial, for server authentication; the worker CA did not sign it.
    secrets = config.secrets
    cert = secrets.server_cert.read_bytes()
    assert certificate_names(cert) == ["autoscaler-daemon", "127.0.0.1"]
    assert issued_by(cert, secrets.ca_cert.read_bytes())
    assert not issued_by(cert, secrets.worker_ca_cert.read_bytes())
    usage = x509.load_pem_x509_certificate(cert).extensions.get_extension_for_class(
        x509.ExtendedKeyUsage
    )
    assert list(usage.value) == [x509.ExtendedKeyUsageOID.SERVER_AUTH]
    assert Authority.load(secrets.ca_cert, secrets.ca_key).cert_pem == secrets.ca_cert.read_bytes()
    assert secrets.ca_cert.read_bytes() != secrets.worker_ca_cert.read_bytes()


def test_init_again_reissues_the_server_certificate_for_a_new_advertised_host(tmp_path):
    main(["init", "--dir", str(tmp_path), "--local", "--name", "c1"])
    path = tmp_path / "autoscaler.toml"
    secrets = load_cluster_config(path).secrets
    kept = {p: p.read_bytes() for p in (secrets.ca_cert, secrets.worker_ca_key, secrets.api_token)}
    path.write_text(path.read_text().replace("[api]\n", '[api]\nadvertise = "10.0.7.5:7443"\n'))
    main(["init", "--dir", str(tmp_path)])
    assert certificate_names(secrets.server_cert.read_bytes()) == ["autoscaler-daemon", "10.0.7.5"]
    assert {p: p.read_bytes() for p in kept} == kept  # the CAs and the token stay
    # With the server CA's key kept offline, init keeps what matches and says what it needs
    # to change the rest (never a new CA, which every client would have to be given again).
    key = secrets.ca_key.read_bytes()
    secrets.ca_key.unlink()
    main(["init", "--dir", str(tmp_path)])
    assert not secrets.ca_key.exists() and secrets.ca_cert.read_bytes() == kept[secrets.ca_cert]
    path.write_text(path.read_text().replace("10.0.7.5:7443", "10.0.7.6:7443"))
    with pytest.raises(InputError, match="needs the server CA's key: put it back as"):
        init_cluster(tmp_path)
    secrets.ca_key.write_bytes(key)


def test_init_twice_never_overwrites_a_secret_or_the_configuration(tmp_path):
    main(["init", "--dir", str(tmp_path), "--local"])
    before = {n: (tmp_path / "secrets" / n).read_bytes() for n in SECRETS}
    config_before = (tmp_path / "autoscaler.toml").read_text()
    main(["init", "--dir", str(tmp_path), "--name", "other"])
    assert {n: (tmp_path / "secrets" / n).read_bytes() for n in SECRETS} == before
    assert (tmp_path / "autoscaler.toml").read_text() == config_before


def test_two_inits_make_two_different_clusters(tmp_path):
    main(["init", "--dir", str(tmp_path / "a")])
    main(["init", "--dir", str(tmp_path / "b")])
    a = load_cluster_config(tmp_path / "a" / "autoscaler.toml").cluster.name
    b = load_cluster_config(tmp_path / "b" / "autoscaler.toml").cluster.name
    assert a != b  # no shared default: tags and tokens of two deployments never collide


def test_a_local_cluster_keeps_storage_and_state_beside_its_configuration(tmp_path):
    main(["init", "--dir", str(tmp_path), "--local", "--name", "laptop"])
    config = load_cluster_config(tmp_path / "autoscaler.toml")
    assert config.cloud.provider == "local"
    assert config.storage.url == f"file://{tmp_path.resolve()}/storage"
    assert config.state.url == f"sqlite:///{tmp_path.resolve()}/state.db"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ("interval_s = 30 ", "interval_s = -5 "),
            "[cluster]: field 'interval_s' = -5: must be a number >= 1",
        ),
        (
            ("step_s = 2 ", "step_s = 0.0001 "),
            "[cluster]: field 'step_s' = 0.0001: must be a number >= 0.5",
        ),
        (
            ("max_context_mb = 256", "max_context_mb = 1e12"),
            "[limits]: field 'max_context_mb' = 1000000000000.0: must be a number <= 16,384",
        ),
        (("interval_s = 30 ", "interval_s = nan "), "[cluster]: field 'interval_s' = nan"),
        (("step_s = 2 ", "step_s = 2\ncolour = 'red'"), "[cluster]: field 'colour': unknown field"),
        (('provider = "local"', 'provider = "gcp"'), "[cloud]: field 'provider' = 'gcp'"),
        (('listen = "127.0.0.1:7443"', 'listen = "7443"'), "must be HOST:PORT"),
        (("max_attempts = 3", "max_attempts = 0"), "[limits]: field 'max_attempts' = 0"),
        (
            ("default_throughput = 0.95", "default_throughput = 1.5"),
            "[planner]: field 'default_throughput' = 1.5",
        ),
        (
            ("min_throughput = 0.0", "min_throughput = -0.1"),
            "[planner]: field 'min_throughput' = -0.1",
        ),
        (
            ("wait_jct_factor = 1.0", "wait_jct_factor = 0.5"),
            "[planner]: field 'wait_jct_factor' = 0.5: must be a number >= 1",
        ),
        (
            ("wait_min_saving = 0.1", "wait_min_saving = 1.5"),
            "[planner]: field 'wait_min_saving' = 1.5: must be a number <= 1",
        ),
        (('name = "c1"', 'name = "bad/name"'), "[cluster]: field 'name' = 'bad/name'"),
        (
            ("heartbeat_s = 10 ", "heartbeat_s = 4 "),
            "[timeouts]: field 'heartbeat_s' = 4: must be longer than heartbeat_interval_s",
        ),
        (
            ("retry_backoff_max_s = 300 ", "retry_backoff_max_s = 5 "),
            "[timeouts]: field 'retry_backoff_max_s' = 5: must be at least retry_backoff_s",
        ),
        (
            ("worker_orphan_max_s = 7200 ", "worker_orphan_max_s = -1 "),
            "[timeouts]: field 'worker_orphan_max_s' = -1",
        ),
        (
            ("retry_backoff_s = 10 ", "retry_backoff_s = 10\nretry_backof_s = 3"),
            "[timeouts]: field 'retry_backof_s': unknown field",
        ),
    ],
)
def test_a_bad_value_is_one_line_naming_the_table_field_and_value(tmp_path, edit, message):
    main(["init", "--dir", str(tmp_path), "--local", "--name", "c1"])
    path = tmp_path / "autoscaler.toml"
    old, new = edit
    text = path.read_text()
    # init takes the next free port when 7443 is busy (another cluster on this machine)
    old = old.replace("127.0.0.1:7443", load_cluster_config(path).api.listen)
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(InputError) as bad:
        load_cluster_config(path)
    assert message in str(bad.value) and "\n" not in str(bad.value)


def test_the_planner_table_names_the_planner_and_its_minimum_throughput(tmp_path):
    main(["init", "--dir", str(tmp_path), "--local", "--name", "c1"])
    path = tmp_path / "autoscaler.toml"
    text = path.read_text()
    edited = text.replace('name = "eva" ', 'name = "eva-plain" ').replace(
        "min_throughput = 0.0", "min_throughput = 0.8"
    )
    assert edited.count("eva-plain") == text.count("eva-plain") + 1
    path.write_text(edited)
    planner = load_cluster_config(path).planner.planner()
    assert (planner.name, planner.min_throughput) == ("eva-plain", 0.8)


def test_the_planner_table_sets_the_waiting_rule_off_unless_asked(tmp_path):
    main(["init", "--dir", str(tmp_path), "--local", "--name", "c1"])
    path = tmp_path / "autoscaler.toml"
    assert load_cluster_config(path).control_options().waiting is None
    text = path.read_text()
    assert "wait_jct_factor = 1.0 " in text  # init lists the rule, off
    path.write_text(text.replace("wait_jct_factor = 1.0 ", "wait_jct_factor = 1.05"))
    assert load_cluster_config(path).control_options().waiting == WaitPolicy(1.05, 0.1)


def test_a_silent_worker_is_lost_within_two_heartbeats_by_default(tmp_path):
    main(["init", "--dir", str(tmp_path), "--local", "--name", "c1"])
    timeouts = load_cluster_config(tmp_path / "autoscaler.toml").timeouts
    # shown lost at the step after the timeout: within 15 s on the local cloud
    assert timeouts.heartbeat_s <= 2 * timeouts.heartbeat_interval_s
    assert timeouts.heartbeat_s + 5.0 <= 15.0


def test_ec2_may_not_contradict_the_cluster(tmp_path):
    main(["init", "--dir", str(tmp_path), "--name", "c1"])
    path = tmp_path / "autoscaler.toml"
    path.write_text(path.read_text().replace("[ec2]\n", '[ec2]\ncluster_id = "c2"\n'))
    with pytest.raises(InputError, match="contradicts \\[cluster\\]"):
        load_cluster_config(path)


def test_a_missing_configuration_says_how_to_make_one(tmp_path, capsys):
    assert main(["status", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "autoscaler init" in capsys.readouterr().err


def test_a_daemon_on_ec2_refuses_to_start_without_each_spending_limit(tmp_path):
    """`init` writes every limit; a file without one of them stops the daemon before it
    publishes or launches anything, naming what to set."""
    from app.wiring import _cloud

    main(["init", "--dir", str(tmp_path), "--name", "c1", "--bucket", "my-bucket"])
    path = tmp_path / "autoscaler.toml"
    written = path.read_text()
    for limit in ("max_instances", "max_hourly_spend", "max_daily_spend"):
        kept = [line for line in written.splitlines() if not line.startswith(f"{limit} =")]
        assert len(kept) == len(written.splitlines()) - 1, limit  # init wrote it
        path.write_text("\n".join(kept) + "\n")
        config = load_cluster_config(path)
        with pytest.raises(InputError, match=f"set {limit}: a daemon on EC2 spends money"):
            _cloud(config, publish=True)
    path.write_text(written)
    assert load_cluster_config(path).provisioner.ec2.dry_run  # and its first run is dry


def test_teams_tables_give_the_round_its_fair_share_policy(tmp_path):
    main(["init", "--dir", str(tmp_path), "--local", "--name", "c1"])
    path = tmp_path / "autoscaler.toml"
    assert load_cluster_config(path).control_options().teams is None  # no tables: no policy
    path.write_text(
        path.read_text()
        + '\n[teams.research]\nweight = 2.0\n\n[teams."ml ops"]\nmax_hourly_spend = 3.0\n'
        + "max_share = 0.5\n"
    )
    teams = load_cluster_config(path).control_options().teams
    assert teams is not None
    assert teams.limits("research") == TeamLimits(weight=2.0)
    assert teams.limits("ml ops") == TeamLimits(1.0, 3.0, 0.5)
    assert teams.limits("anyone else") == TeamLimits()


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("weight = 0", "t.weight. = 0: must be a positive number"),
        ("max_share = 1.5", "at most 1"),
        ("wait = 1", "wait"),
    ],
)
def test_a_bad_team_table_names_its_field(tmp_path, table, message):
    main(["init", "--dir", str(tmp_path), "--local", "--name", "c1"])
    path = tmp_path / "autoscaler.toml"
    path.write_text(path.read_text() + f"\n[teams.t]\n{table}\n")
    with pytest.raises(InputError, match=message):
        load_cluster_config(path)


def test_the_transient_back_off_and_the_workers_spend_brake_are_set_in_timeouts(tmp_path):
    from provisioners.local import LocalCloud

    main(["init", "--dir", str(tmp_path), "--local", "--name", "c1"])
    path = tmp_path / "autoscaler.toml"
    defaults = load_cluster_config(path)
    assert defaults.control_options().backoff.delay_s(1) == 10.0
    assert defaults.control_options().backoff.delay_s(9) == 300.0
    text = path.read_text()
    for old, new in (
        ("retry_backoff_s = 10 ", "retry_backoff_s = 2 "),
        ("retry_backoff_max_s = 300 ", "retry_backoff_max_s = 60 "),
        ("worker_orphan_timeout_s = 1800 ", "worker_orphan_timeout_s = 600 "),
        ("worker_orphan_max_s = 7200 ", "worker_orphan_max_s = 0 "),
    ):
        assert old in text
        text = text.replace(old, new, 1)
    path.write_text(text)
    config = load_cluster_config(path)
    backoff = config.control_options().backoff
    assert [backoff.delay_s(n) for n in (1, 2, 3, 6, 7)] == [2.0, 4.0, 8.0, 60.0, 60.0]
    # The local cloud starts its agents with the brake the file sets (0: never).
    from app.wiring import local_cloud

    cloud = local_cloud(config)
    assert isinstance(cloud, LocalCloud)
    assert (cloud.stop_tasks, cloud.orphan_timeout_s, cloud.orphan_max_s) == (True, 600.0, 0.0)


def test_the_dashboard_is_on_for_a_local_cluster_and_off_unless_enabled_otherwise(tmp_path):
    main(["init", "--dir", str(tmp_path / "local"), "--local", "--name", "laptop"])
    local = load_cluster_config(tmp_path / "local" / "autoscaler.toml")
    assert local.dashboard.enabled
    assert local.dashboard.listen not in (local.api.listen, local.metrics.listen)
    main(["init", "--dir", str(tmp_path / "ec2"), "--name", "prod"])
    assert not load_cluster_config(tmp_path / "ec2" / "autoscaler.toml").dashboard.enabled
    bare = tmp_path / "bare.toml"
    bare.write_text('[cluster]\nname = "c1"\n')
    assert not load_cluster_config(bare).dashboard.enabled  # no [dashboard]: off


def test_the_dashboard_may_not_take_the_apis_port(tmp_path):
    main(["init", "--dir", str(tmp_path), "--local", "--name", "c1"])
    path = tmp_path / "autoscaler.toml"
    api = load_cluster_config(path).api.listen
    text = path.read_text()
    dashboard = load_cluster_config(path).dashboard.listen
    path.write_text(text.replace(f'listen = "{dashboard}"', f'listen = "{api}"'))
    with pytest.raises(InputError) as bad:
        load_cluster_config(path)
    assert "[dashboard]: field 'listen'" in str(bad.value) and "own port" in str(bad.value)
    path.write_text(
        text.replace("enabled = true", "enabled = false").replace(
            f'listen = "{dashboard}"', f'listen = "{api}"'
        )
    )
    assert not load_cluster_config(path).dashboard.enabled  # off: its address is not used
