"""deploy/autoscaler.service: hardened, restarted on failure, stopped by SIGTERM, and its
ExecStart a command line our parser accepts; checked by `systemd-analyze verify` where
systemd is installed (that part is skipped elsewhere)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path, PurePosixPath

import pytest

from app.cli import build_parser
from app.config import parse_cluster_config
from app.init import config_template

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "autoscaler.service"


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Section -> key -> every value, in order (systemd keys may repeat: Environment=)."""
    sections: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            continue
        assert current is not None, f"a key outside any section: {line}"
        key, sep, value = line.partition("=")
        assert sep, f"not KEY=VALUE: {line}"
        sections[current][key.strip()].append(value.strip())
    return sections


@pytest.fixture(scope="module")
def unit() -> dict[str, dict[str, list[str]]]:
    return parse_unit(UNIT.read_text())


def one(unit, section: str, key: str) -> str:
    values = unit[section][key]
    assert len(values) == 1, (section, key, values)
    return values[0]


def environment(unit) -> dict[str, str]:
    pairs = [v.split("=", 1) for v in unit["Service"]["Environment"]]
    return dict(pairs)


def test_the_service_runs_unprivileged_and_hardened(unit):
    assert one(unit, "Service", "User") == "autoscaler"
    assert one(unit, "Service", "NoNewPrivileges") == "yes"
    assert one(unit, "Service", "ProtectSystem") == "strict"
    assert one(unit, "Service", "ProtectHome") == "yes"
    assert one(unit, "Service", "CapabilityBoundingSet") == ""
    assert one(unit, "Service", "RestrictAddressFamilies").split() == [
        "AF_INET",
        "AF_INET6",
        "AF_UNIX",
    ]
    assert one(unit, "Install", "WantedBy") == "multi-user.target"


def test_it_restarts_on_failure_and_stops_by_sigterm(unit):
    assert one(unit, "Service", "Restart") == "on-failure"
    # The daemon's own handler: SIGTERM finishes the round or step (app.commands.cluster).
    assert one(unit, "Service", "KillSignal") == "SIGTERM"
    assert float(one(unit, "Service", "TimeoutStopSec")) >= 30


def test_exec_start_is_a_command_line_our_parser_accepts(unit):
    argv = shlex.split(one(unit, "Service", "ExecStart"))
    assert PurePosixPath(argv[0]) == PurePosixPath("/opt/autoscaler/bin/autoscaler")
    args = build_parser().parse_args(argv[1:])
    assert args.command == "daemon" and args.dry_run is False
    assert str(args.config) == environment(unit)["AUTOSCALER_CONFIG"]
    # A flag that does not exist is refused by the same parser (the check can fail).
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv[1:], "--no-such-flag"])


def test_everything_the_daemon_writes_is_in_a_writable_path(unit, tmp_path):
    writable = [PurePosixPath(p) for v in unit["Service"]["ReadWritePaths"] for p in v.split()]
    assert PurePosixPath("/var/lib") / one(unit, "Service", "StateDirectory") in writable
    assert PurePosixPath("/var/cache") / one(unit, "Service", "CacheDirectory") in writable
    env = environment(unit)
    # The EC2 catalog cache and a default SQLite state (XDG dirs), and the working directory.
    for path in (
        env["XDG_CACHE_HOME"],
        env["XDG_STATE_HOME"],
        one(unit, "Service", "WorkingDirectory"),
    ):
        assert any(PurePosixPath(path).is_relative_to(w) for w in writable), path
    # The README's recipe: `autoscaler init --dir /etc/autoscaler`, then [state] path under
    # the state directory. The loaded file's SQLite database (and its leader lock beside it)
    # is then writable; the configuration and its secrets stay read-only.
    import tomllib

    text = config_template("c1", tmp_path, local=False, region="us-east-1", bucket="bucket-b")
    text = text.replace('path = "state.db"', 'path = "/var/lib/autoscaler/state.db"')
    config_file = PurePosixPath(env["AUTOSCALER_CONFIG"])
    config = parse_cluster_config(tomllib.loads(text), Path(config_file))
    database = PurePosixPath(config.state.url.removeprefix("sqlite:///").replace("//", "/"))
    assert any(database.parent.is_relative_to(w) for w in writable), database
    assert not any(PurePosixPath(config.secrets.dir).is_relative_to(w) for w in writable)


def test_systemd_analyze_verify_finds_nothing(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    # verify checks that ExecStart's program exists: point it at this checkout's.
    installed = Path(sys.executable).with_name("autoscaler")
    if not installed.exists():
        pytest.skip("no installed `autoscaler` program beside this interpreter")
    text = UNIT.read_text().replace("/opt/autoscaler/bin/autoscaler", str(installed))
    copy = tmp_path / "autoscaler.service"
    copy.write_text(text)
    checked = subprocess.run(
        [analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60
    )
    # verify exits 0 even for an unknown key or a bad value; it says so on stderr.
    mentions = [line for line in checked.stderr.splitlines() if "autoscaler.service" in line]
    assert checked.returncode == 0 and mentions == [], checked.stderr
    # ... which it would for a typo in a hardening key.
    copy.write_text(text.replace("ProtectSystem=strict", "ProtectSystem=strikt"))
    broken = subprocess.run(
        [analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60
    )
    assert "autoscaler.service:" in broken.stderr and "strikt" in broken.stderr
