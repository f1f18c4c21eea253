"""`autoscaler catalog show` and `autoscaler catalog refresh` as a user runs them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from app.cli import main
from provisioners.aws import AwsCaller
from provisioners.catalog import (
    bundled_price_table_path,
    describe_catalog,
    load_catalog_cache,
    load_price_table,
    save_catalog_cache,
)
from provisioners.config import EC2Config

BUNDLED = json.loads(bundled_price_table_path("us-east-1").read_text())


def write_config(tmp_path: Path, body: str = "") -> Path:
    path = tmp_path / "autoscaler.toml"
    path.write_text(f'[ec2]\ncluster_id = "t"\ncache_dir = "{tmp_path / "cache"}"\n{body}')
    return path


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def row(output: str, name: str) -> list[str]:
    [line] = [line for line in output.splitlines() if line.startswith(name + " ")]
    return line.split()


def test_show_without_account_or_cache_prints_the_bundled_catalog_honestly(tmp_path, capsys):
    assert main(["catalog", "show", "--config", str(write_config(tmp_path))]) == 0
    out = capsys.readouterr().out
    prose = " ".join(out.split())  # notes wrap to the terminal's width

    # Eva's 21 types less the three p3 ones, not allowed by default (their GPUs need a
    # driver AWS ships only on an image the worker does not run on).
    assert "EC2 catalog for us-east-1: 18 instance types" in out
    # type, gpus, cores, vcpus (unknown offline), GiB, $/h, zones (unknown offline)
    assert row(out, "c7i.large") == ["c7i.large", "0", "1", "-", "4", "0.08925", "-"]
    assert "p3." not in out
    assert "Source: bundled offline catalog, no AWS call" in out
    assert f"retrieved {BUNDLED['retrieved']}" in prose and "unknown" in prose
    assert "Run `autoscaler catalog refresh`" in out


def test_show_warns_when_the_prices_are_older_than_90_days(tmp_path, capsys):
    cache = tmp_path / "cache"
    cache.mkdir()
    old = {**BUNDLED, "retrieved": "2020-01-01", "source": "AWS Pricing API (GetProducts)"}
    (cache / "prices-us-east-1.json").write_text(json.dumps(old))
    assert main(["catalog", "show", "--config", str(write_config(tmp_path))]) == 0
    prose = " ".join(capsys.readouterr().out.split())
    assert "Warning: the prices of us-east-1 were retrieved" in prose
    assert "(2020-01-01), longer ago than 90 days: run `autoscaler catalog refresh`" in prose


def test_show_respects_the_configured_families(tmp_path, capsys):
    config = write_config(tmp_path, 'families = ["p3"]\n')
    assert main(["catalog", "show", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "3 instance types" in out and "c7i.large" not in out


def test_show_prints_the_cached_catalog_with_its_age(tmp_path, ec2, capsys):
    config = EC2Config(cache_dir=tmp_path / "cache")
    built = describe_catalog(
        AwsCaller(ec2),
        config,
        load_price_table(bundled_price_table_path("us-east-1")),
        now_s=time.time() - 2 * 3600,
    )
    save_catalog_cache(built, tmp_path / "cache" / "catalog-us-east-1.json")

    assert main(["catalog", "show", "--config", str(write_config(tmp_path))]) == 0
    out = capsys.readouterr().out

    assert "18 instance types" in out
    assert re.search(r"Source: AWS \(cached; fetched 2\.0 h ago\)", out)
    assert row(out, "c7i.large") == [
        "c7i.large",
        "0",
        "1",
        "2",
        "4",
        "0.08925",
        "a",
        "b",
        "c",
        "d",
        "f",
    ]
    assert "p3." not in out  # not allowed by default, so not even looked up


def test_show_flags_a_stale_cache(tmp_path, ec2, capsys):
    config = EC2Config(cache_dir=tmp_path / "cache")
    built = describe_catalog(AwsCaller(ec2), config, None, now_s=time.time() - 30 * 86400)
    save_catalog_cache(built, tmp_path / "cache" / "catalog-us-east-1.json")
    assert main(["catalog", "show", "--config", str(write_config(tmp_path))]) == 0
    out = capsys.readouterr().out
    prose = " ".join(out.split())  # notes wrap to the terminal's width
    assert "30.0 days ago" in prose and "stale, run `autoscaler catalog refresh`" in prose


def test_refresh_updates_the_cache_and_says_which_part_failed(tmp_path, aws, capsys):
    config = write_config(tmp_path)

    status = main(["catalog", "refresh", "--config", str(config)])

    captured = capsys.readouterr()
    assert status == 1  # moto has no Pricing API: the prices were not refreshed
    assert (
        "prices not refreshed" in captured.err
        and "Keeping the current prices (Eva artifact" in captured.err
    )
    assert "catalog not refreshed" not in captured.err
    assert "Source: AWS (fetched 0 s ago)" in captured.out
    cached = load_catalog_cache(tmp_path / "cache" / "catalog-us-east-1.json")
    assert cached is not None and len(cached.catalog) == 18


def test_refresh_without_an_aws_account_falls_back_and_says_so(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("AWS_") or k in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")
    }
    env["AWS_EC2_METADATA_DISABLED"] = "true"  # no instance role to find either

    result = run_cli("catalog", "refresh", "--config", str(write_config(tmp_path)), env=env)

    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr
    warnings = result.stderr.strip().splitlines()
    assert len(warnings) == 2, result.stderr
    assert warnings[0].startswith("autoscaler: warning: prices not refreshed:")
    assert warnings[1].startswith("autoscaler: warning: catalog not refreshed:")
    assert "no usable AWS credentials" in warnings[1] and "aws configure" in warnings[1]
    assert "Showing the bundled catalog instead" in warnings[1]
    assert "Source: bundled offline catalog" in result.stdout
    assert row(result.stdout, "c7i.large")[:6] == ["c7i.large", "0", "1", "-", "4", "0.08925"]


def test_bad_configuration_exits_2_with_one_line_and_no_traceback(tmp_path):
    config = write_config(tmp_path, 'orphan_policy = "kill"\n')
    result = run_cli("catalog", "show", "--config", str(config))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"autoscaler: error: {config}: [ec2]: field 'orphan_policy' = 'kill': "
        "must be one of 'report', 'terminate'"
    ]
