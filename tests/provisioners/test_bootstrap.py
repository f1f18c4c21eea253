"""The worker bootstrap: rendered per launch with no secret in it, run at the shell level on
Amazon Linux 2023 and Ubuntu 22.04/24.04 (package managers, curl, systemd ... stubbed), and
what the daemon publishes for it (the wheelhouse in S3, failure reports) against moto.

pip is stubbed here too: running the script for real in a container (a real offline pip
install from the wheelhouse, the agent then enrolling) is not done yet."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from autoscaler.cloud import CloudRequestError, LaunchRequest
from autoscaler.errors import InputError
from executor.security import Authority
from provisioners.aws import make_client
from provisioners.bootstrap import (
    MAX_USER_DATA_BYTES,
    BootReports,
    WorkerBootstrap,
    fill_template,
    object_presigner,
    publish_wheelhouse,
)
from provisioners.config import EC2Config
from provisioners.wheelhouse import pack, requirements_text
from tests.provisioners.conftest import REGION, live_instances, make_cloud

WHEEL_NAME = "ec2_batch_autoscaler_worker-0.1.0-py3-none-any.whl"
WHEEL_BYTES = b"PK\x03\x04 a worker agent wheel"


def wheelhouse_dir(directory: Path, wheel: bytes = WHEEL_BYTES) -> Path:
    """A wheelhouse of one (fake) wheel and its requirements.txt."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / WHEEL_NAME).write_bytes(wheel)
    (directory / "requirements.txt").write_text(requirements_text(directory))
    return directory


@cache
def wheelhouse_archive() -> tuple[bytes, str]:
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        return pack(wheelhouse_dir(Path(scratch)))


WHEELHOUSE_SHA256 = wheelhouse_archive()[1]
WHEELHOUSE_URL = (
    f"https://bucket.s3.amazonaws.com/autoscaler/wheelhouse/{WHEELHOUSE_SHA256}.tar"
    "?X-Amz-Signature=abc"
)
bash = shutil.which("bash")
needs_bash = pytest.mark.skipif(bash is None, reason="bash is not installed")


@cache
def ca_pem() -> str:
    return Authority.create("test").cert_pem.decode()


def worker_bootstrap(config: EC2Config | None = None, **changes: Any) -> WorkerBootstrap:
    values: dict[str, Any] = {
        "daemon_address": "10.0.0.5:50051",
        "ca_pem": ca_pem(),
        "cluster_id": config.cluster_id if config else "test-cluster",
        "region": config.region if config else REGION,
        "wheelhouse_url": WHEELHOUSE_URL,
        "wheelhouse_sha256": WHEELHOUSE_SHA256,
    }
    return WorkerBootstrap(**{**values, **changes})


# --- rendering ----------------------------------------------------------------------------------


@needs_bash
def test_rendered_user_data_is_valid_bash_with_no_secret_and_the_wheelhouse_pinned(tmp_path):
    script = tmp_path / "user-data.sh"
    script.write_text(worker_bootstrap().render("inst-7"))
    checked = subprocess.run([bash, "-n", str(script)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    text = script.read_text()
    assert "{{" not in text
    assert "INSTANCE_ID=inst-7\n" in text
    assert f"WHEELHOUSE_SHA256={WHEELHOUSE_SHA256}\n" in text
    assert "sha256sum -c" in text
    assert "--no-index" in text and "--require-hashes" in text
    assert "InstanceInitiatedShutdownBehavior=terminate" in text and "shutdown -h now" in text
    # No secret travels, nor any name of one: the agent proves its instance with the
    # identity document AWS signs for it (IMDS), and gets a certificate in exchange.
    assert "TOKEN" not in text.replace("IMDS_TOKEN", "") and "--token" not in text
    assert "--imds" in text and "ssm" not in text.lower()


def test_each_launch_gets_its_own_instance_id_and_a_fresh_wheelhouse_url():
    urls = iter([WHEELHOUSE_URL + "1", WHEELHOUSE_URL + "2"])
    bootstrap = worker_bootstrap(wheelhouse_url=lambda: next(urls))
    first, second = bootstrap.render("inst-1"), bootstrap.render("inst-2")
    assert "INSTANCE_ID=inst-1\n" in first and "INSTANCE_ID=inst-2\n" in second
    assert "X-Amz-Signature=abc1" in first and "X-Amz-Signature=abc2" in second


@needs_bash
def test_values_are_shell_quoted_and_cannot_inject_commands(tmp_path):
    hostile = "$(touch pwned)'; touch pwned2; echo '"
    rendered = fill_template(
        'X={{CA_PEM}}\nprintf %s "$X"\n',
        {name: "x" for name in ("DAEMON_ADDRESS", "CLUSTER_ID", "REGION")}
        | {name: "x" for name in ("INSTANCE_ID", "WHEELHOUSE_URL", "WHEELHOUSE_SHA256")}
        | {"REPORT_URL": ""}
        | {"ACCELERATOR": "", "THROUGHPUT_WINDOW": "300", "CA_PEM": hostile}
        | {"ORPHAN_TIMEOUT": "1800", "ORPHAN_MAX": "7200"},
    )
    ran = subprocess.run([bash, "-c", rendered], capture_output=True, text=True, cwd=tmp_path)
    assert ran.stdout == hostile
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"daemon_address": "10.0.0.5"}, "daemon_address"),
        ({"daemon_address": "x; reboot:50051"}, "daemon_address"),
        ({"daemon_address": "10.0.0.5:70000"}, "daemon_address"),
        ({"ca_pem": "not a certificate"}, "ca_pem"),
        ({"wheelhouse_sha256": "abc"}, "wheelhouse_sha256"),
        ({"region": "Moon-1"}, "region"),
        ({"throughput_window_s": 0}, "throughput_window_s"),
        ({"throughput_window_s": float("inf")}, "throughput_window_s"),
        ({"throughput_window_s": "60"}, "throughput_window_s"),
        ({"orphan_timeout_s": -1}, "orphan_timeout_s"),
        ({"orphan_max_s": float("nan")}, "orphan_max_s"),
        ({"orphan_max_s": True}, "orphan_max_s"),
    ],
)
def test_a_bad_bootstrap_value_is_one_line_naming_the_field(changes, field):
    with pytest.raises(InputError) as error:
        worker_bootstrap(**changes)
    assert f"worker bootstrap: field '{field}'" in str(error.value)
    assert "\n" not in str(error.value)


def test_a_url_that_is_not_a_wheelhouse_or_an_instance_id_that_is_not_one_is_refused():
    with pytest.raises(InputError, match=r"field 'wheelhouse_url'.*http"):
        worker_bootstrap(wheelhouse_url="s3://bucket/a.tar").render("inst-1")
    with pytest.raises(InputError, match=r"field 'wheelhouse_url'.*<sha256>.tar"):
        worker_bootstrap(wheelhouse_url="https://bucket/agent.whl").render("inst-1")
    with pytest.raises(InputError, match="field 'instance_id'"):
        worker_bootstrap().render("inst 1; reboot")


def test_user_data_over_the_ec2_limit_is_refused(tmp_path):
    template = tmp_path / "big.sh"
    template.write_text("#!/bin/bash\n# " + "x" * MAX_USER_DATA_BYTES + "\n")
    with pytest.raises(InputError, match=f"at most {MAX_USER_DATA_BYTES}"):
        worker_bootstrap(template=template).render("inst-1")


def test_a_template_with_an_unknown_placeholder_is_refused(tmp_path):
    template = tmp_path / "t.sh"
    template.write_text("PORT={{MASTER_PORT}}\n")
    with pytest.raises(InputError, match=r"unknown placeholder \{\{MASTER_PORT\}\}"):
        worker_bootstrap(template=template)


# --- EC2Cloud renders it at each launch -------------------------------------------------------


def test_each_instance_gets_user_data_with_its_own_id_and_no_secret(
    config, ec2, client, clock, sleeps
):
    cloud = make_cloud(config, ec2, clock, sleeps, bootstrap=worker_bootstrap(config))

    first = cloud.launch(LaunchRequest("c7i.large", "inst-1"))
    second = cloud.launch(LaunchRequest("r7i.large", "inst-2"))

    for launched, our_id in ((first, "inst-1"), (second, "inst-2")):
        sent = ec2.describe_instance_attribute(InstanceId=launched.cloud_id, Attribute="userData")
        user_data = base64.b64decode(sent["UserData"]["Value"]).decode()
        assert f"INSTANCE_ID={our_id}\n" in user_data
        assert "TOKEN_PARAMETER" not in user_data and "--imds" in user_data
    assert len(live_instances(ec2)) == 2


def test_a_bootstrap_for_another_cluster_or_too_big_is_refused_at_start(
    config, ec2, clock, sleeps, tmp_path
):
    with pytest.raises(InputError, match="for cluster other in"):
        make_cloud(
            config, ec2, clock, sleeps, bootstrap=worker_bootstrap(config, cluster_id="other")
        )
    template = tmp_path / "big.sh"
    template.write_text("#!/bin/bash\n# " + "x" * MAX_USER_DATA_BYTES + "\n")
    with pytest.raises(InputError, match=f"at most {MAX_USER_DATA_BYTES}"):
        make_cloud(
            config, ec2, clock, sleeps, bootstrap=worker_bootstrap(config, template=template)
        )


def test_a_presigner_failing_at_a_launch_is_a_request_error(config, ec2, clock, sleeps):
    urls = iter([WHEELHOUSE_URL, "ftp://nowhere/x.tar"])  # the first is the start-up check
    bootstrap = worker_bootstrap(config, wheelhouse_url=lambda: next(urls))
    cloud = make_cloud(config, ec2, clock, sleeps, bootstrap=bootstrap)
    with pytest.raises(CloudRequestError, match=r"worker bootstrap: .*wheelhouse_url"):
        cloud.launch(LaunchRequest("c7i.large", "inst-1"))
    assert live_instances(ec2) == []


# --- publishing the wheelhouse, reading failure reports --------------------------------------


def test_the_wheelhouse_is_published_under_its_hash_once_and_presigned_per_launch(aws, tmp_path):
    s3 = make_client("s3", REGION)  # as the daemon makes it: SigV4 presigned URLs
    s3.create_bucket(Bucket="research-batch-artifacts")
    house = wheelhouse_dir(tmp_path / "wheelhouse")
    puts: list[str] = []
    s3.meta.events.register("before-call.s3.PutObject", lambda **_: puts.append("put"))

    url, sha256 = publish_wheelhouse(s3, "research-batch-artifacts", "autoscaler/", house)
    again = publish_wheelhouse(s3, "research-batch-artifacts", "autoscaler", house)

    key = f"autoscaler/wheelhouse/{WHEELHOUSE_SHA256}.tar"
    assert (url, sha256) == (f"s3://research-batch-artifacts/{key}", WHEELHOUSE_SHA256)
    assert again == (url, sha256) and puts == ["put"]  # content-addressed: uploaded once
    body = s3.get_object(Bucket="research-batch-artifacts", Key=key)["Body"].read()
    assert body == wheelhouse_archive()[0]
    presigned = object_presigner(s3, url, expires_s=900)()
    assert key in presigned and "X-Amz-Expires=900" in presigned
    assert "X-Amz-Signature=" in presigned
    rendered = worker_bootstrap(wheelhouse_url=object_presigner(s3, url), wheelhouse_sha256=sha256)
    assert f"{WHEELHOUSE_SHA256}.tar" in rendered.render("inst-1")


def test_a_wheel_the_requirements_do_not_pin_is_never_published(client, tmp_path):
    house = wheelhouse_dir(tmp_path / "wheelhouse")
    (house / WHEEL_NAME).write_bytes(b"changed since it was built")
    with pytest.raises(InputError, match=r"not pinned by requirements\.txt"):
        publish_wheelhouse(client("s3"), "bucket", "p", house)
    with pytest.raises(InputError, match=r"no requirements\.txt"):
        publish_wheelhouse(client("s3"), "bucket", "p", tmp_path)


def test_each_launch_gets_a_report_url_under_the_clusters_prefix_read_back_by_the_daemon(aws):
    s3 = make_client("s3", REGION)
    s3.create_bucket(Bucket="research-batch-artifacts")
    reports = BootReports(s3, "research-batch-artifacts", "autoscaler")
    rendered = worker_bootstrap(reports=reports).render("inst-3")
    [line] = [x for x in rendered.splitlines() if x.startswith("REPORT_URL=")]
    assert "autoscaler/instances/inst-3/bootstrap-report.txt" in line
    assert "X-Amz-Signature=" in line
    assert reports.read("inst-3") == ""  # none left yet
    s3.put_object(
        Bucket="research-batch-artifacts",
        Key="autoscaler/instances/inst-3/bootstrap-report.txt",
        Body=b"FAILED while checking the NVIDIA driver (exit status 1): nvidia-smi failed\nlog",
    )
    assert reports.read("inst-3") == (
        "FAILED while checking the NVIDIA driver (exit status 1): nvidia-smi failed | log"
    )


# --- the script itself, at the shell level ------------------------------------------------------

STUB = """#!/bin/bash
echo "$(basename "$0") $*" >> "$CALLS"
if [ "${FAIL_COMMAND:-}" = "$(basename "$0")" ]; then echo "injected failure" >&2; exit 1; fi
"""
#: What some stubs do besides recording the call (and failing when told to).
BEHAVIOUR = {
    # AL2023 ships curl-minimal: asking dnf for curl is the conflict that broke the old script.
    "dnf": 'case " $* " in *" curl "*) echo "curl conflicts with curl-minimal" >&2; exit 1;; esac',
    # First boot on Ubuntu: unattended-upgrades holds the lists lock for the first update.
    "apt-get": (
        'if [ -n "${APT_LOCKED_ONCE:-}" ] && [ ! -e "$APT_LOCKED_ONCE" ]; then\n'
        '  touch "$APT_LOCKED_ONCE"; echo "E: Could not get lock /var/lib/apt/lists/lock" >&2\n'
        "  exit 100\nfi"
    ),
    "curl": (
        'case "$*" in\n'
        "  *api/token*) echo imds-session ;;\n"
        "  *local-ipv4*) echo 10.0.0.7 ;;\n"
        '  *" -X PUT "*) while [ $# -gt 0 ]; do\n'
        '      case "$1" in @*) cp "${1#@}" "$REPORT_SINK";; esac; shift; done ;;\n'
        '  *) while [ $# -gt 0 ]; do [ "$1" = -o ] && cp "$WHEEL_SOURCE" "$2"; shift; done ;;\n'
        "esac"
    ),
    # python3.x -m venv DIR makes a virtualenv whose pip and autoscaler-worker are stubs too.
    "python": (
        'if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin"\n'
        '  for tool in pip autoscaler-worker; do cp "$STUBS/.stub" "$3/bin/$tool"; done\n'
        "fi"
    ),
}
COMMANDS = (
    "dnf",
    "apt-get",
    "curl",
    "systemctl",
    "docker",
    "useradd",
    "usermod",
    "chown",
    "shutdown",
    "poweroff",
    "sleep",
    "nvidia-smi",
    "nvidia-ctk",
    "python3.11",
    "python3.12",
)
OS_RELEASE = {
    "al2023": 'ID="amzn"\nVERSION_ID="2023"\nPRETTY_NAME="Amazon Linux 2023"\n',
    "ubuntu-22.04": 'ID=ubuntu\nVERSION_ID="22.04"\nPRETTY_NAME="Ubuntu 22.04.4 LTS"\n',
    "ubuntu-24.04": 'ID=ubuntu\nVERSION_ID="24.04"\nPRETTY_NAME="Ubuntu 24.04 LTS"\n',
    "debian-12": 'ID=debian\nVERSION_ID="12"\nPRETTY_NAME="Debian GNU/Linux 12"\n',
}


class FixedReportUrl:
    """A report URL that is the same for every instance (the stubbed curl keeps the body)."""

    def put_url(self, instance_id: str) -> str:
        return f"https://bucket.s3.amazonaws.com/instances/{instance_id}/report?X-Amz-Signature=r"


@dataclass
class Boot:
    """One run of the rendered user data on a pretend instance."""

    status: int
    calls: list[str]
    root: Path
    output: str
    report: str | None = None  # what the script PUT to its report URL

    def called(self, command: str) -> list[str]:
        return [c for c in self.calls if c.split(" ", 1)[0] == command]

    @property
    def shut_down(self) -> bool:
        return bool(self.called("shutdown"))


def boot(
    tmp_path: Path,
    image: str,
    *,
    accelerator: str | None = None,
    missing: tuple[str, ...] = (),
    wheelhouse: bytes | None = None,
    bootstrap: WorkerBootstrap | None = None,
    **env: str,
) -> Boot:
    """Render the bootstrap and run it under bash with every system command stubbed.

    The stubs record their arguments; the script's files land under a scratch root
    (AUTOSCALER_BOOTSTRAP_ROOT). PATH holds the stubs and /usr/bin:/bin only, and
    shutdown, poweroff and systemctl are always stubs.
    """
    stubs, root = tmp_path / "stubs", tmp_path / "root"
    stubs.mkdir()
    (root / "etc").mkdir(parents=True)
    (root / "tmp").mkdir()
    (root / "etc" / "os-release").write_text(OS_RELEASE[image])
    (stubs / ".stub").write_text(STUB)
    for command in COMMANDS:
        if command in missing:
            continue
        extra = BEHAVIOUR.get("python" if command.startswith("python") else command, "")
        path = stubs / command
        path.write_text(STUB + extra + "\n")
        path.chmod(0o755)
    (stubs / ".stub").chmod(0o755)
    assert all((stubs / c).exists() for c in ("shutdown", "poweroff", "systemctl"))
    source = tmp_path / "downloaded.tar"
    source.write_bytes(wheelhouse if wheelhouse is not None else wheelhouse_archive()[0])
    script = tmp_path / "user-data.sh"
    script.write_text((bootstrap or worker_bootstrap()).render("inst-7", accelerator=accelerator))
    calls = tmp_path / "calls"
    calls.touch()
    environment = {
        "PATH": f"{stubs}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "CALLS": str(calls),
        "STUBS": str(stubs),
        "WHEEL_SOURCE": str(source),
        "REPORT_SINK": str(tmp_path / "report.txt"),
        "AUTOSCALER_BOOTSTRAP_ROOT": str(root),
        **env,
    }
    ran = subprocess.run(
        [bash, str(script)], env=environment, capture_output=True, text=True, timeout=60
    )
    sink = tmp_path / "report.txt"
    report = sink.read_text() if sink.exists() else None
    return Boot(ran.returncode, calls.read_text().splitlines(), root, ran.stderr, report)


def assert_worker_installed(result: Boot, python: str) -> None:
    assert result.status == 0, result.output
    assert not result.shut_down
    root = result.root
    [venv] = result.called(python)
    assert venv == f"{python} -m venv {root}/opt/autoscaler-worker"
    [pip] = result.called("pip")
    assert pip.startswith("pip install --isolated")
    assert " --no-index --find-links " in pip and " --require-hashes -r " in pip
    assert pip.endswith("/wheels/requirements.txt")
    assert result.called("useradd") == [
        "useradd --system --home-dir /var/lib/autoscaler-worker --shell /usr/sbin/nologin "
        "autoscaler-worker"
    ]
    assert result.called("usermod") == ["usermod -a -G docker autoscaler-worker"]
    assert "systemctl enable --now docker" in result.calls
    assert result.calls[-1] == "systemctl enable --now autoscaler-worker"
    unit = (root / "etc/systemd/system/autoscaler-worker.service").read_text()
    assert "User=autoscaler-worker\n" in unit and "SupplementaryGroups=docker\n" in unit
    assert " --imds " in unit and "--token" not in unit  # its proof: the identity document
    assert "--instance-id ${AUTOSCALER_INSTANCE_ID}" in unit
    assert "--ca /etc/autoscaler-worker/ca.pem" in unit
    env = (root / "etc/autoscaler-worker/env").read_text()
    assert "AUTOSCALER_INSTANCE_ID=inst-7\n" in env
    assert "AUTOSCALER_DAEMON=10.0.0.5:50051\n" in env
    assert "TOKEN" not in env and "ADVERTISE" not in env and f"AWS_REGION={REGION}\n" in env
    assert (root / "etc/autoscaler-worker/ca.pem").read_text().strip() == ca_pem().strip()


@needs_bash
def test_the_worker_reports_throughput_over_the_window_its_user_data_names(tmp_path):
    # The cluster's rounds run every minute: jobs report over one minute, not five.
    result = boot(tmp_path, "al2023", bootstrap=worker_bootstrap(throughput_window_s=60))
    assert result.status == 0, result.output
    unit = (result.root / "etc/systemd/system/autoscaler-worker.service").read_text()
    [command] = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert command.endswith(" --throughput-window 60")


@needs_bash
def test_the_worker_checkpoints_its_tasks_when_stopped_and_brakes_as_the_cluster_says(tmp_path):
    # Scale-in, drain and `down` terminate the instance: its shutdown stops the agent with
    # SIGTERM, which (--stop-tasks) checkpoints the tasks first, within systemd's stop timeout.
    bootstrap = worker_bootstrap(orphan_timeout_s=600, orphan_max_s=0)
    result = boot(tmp_path, "al2023", bootstrap=bootstrap)
    assert result.status == 0, result.output
    unit = (result.root / "etc/systemd/system/autoscaler-worker.service").read_text()
    [command] = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    flags = command.split()
    assert "--stop-tasks" in flags
    assert flags[flags.index("--orphan-timeout") + 1] == "600"
    assert flags[flags.index("--orphan-max") + 1] == "0"
    [stop] = [line for line in unit.splitlines() if line.startswith("TimeoutStopSec=")]
    assert int(stop.split("=")[1]) >= 10 + 30 + 60  # checkpoint wait, grace, upload patience


@needs_bash
def test_amazon_linux_2023_installs_without_touching_curl_minimal(tmp_path):
    result = boot(tmp_path, "al2023")
    assert_worker_installed(result, "python3.11")
    [dnf] = result.called("dnf")
    assert dnf == "dnf install -y -q docker python3.11 python3.11-pip tar"
    assert result.called("apt-get") == []


@needs_bash
def test_ubuntu_22_04_waits_for_the_first_boot_apt_lock(tmp_path):
    result = boot(tmp_path, "ubuntu-22.04", APT_LOCKED_ONCE=str(tmp_path / "lock-released"))
    assert_worker_installed(result, "python3.11")
    apt = result.called("apt-get")
    assert all("-o DPkg::Lock::Timeout=600" in call for call in apt)
    assert [c.split()[-1] for c in apt[:2]] == ["update", "update"]  # locked, then retried
    assert result.called("sleep")  # it waited before retrying
    [install] = [c for c in apt if " install " in c]
    assert "docker.io python3.11 python3.11-venv" in install
    assert result.called("dnf") == []


@needs_bash
def test_ubuntu_24_04_uses_its_own_python(tmp_path):
    result = boot(tmp_path, "ubuntu-24.04")
    assert_worker_installed(result, "python3.12")
    [install] = [c for c in result.called("apt-get") if " install " in c]
    assert "docker.io python3-venv" in install


@needs_bash
@pytest.mark.parametrize(
    "command",
    [
        "dnf",
        "systemctl",
        "docker",
        "curl",
        "python3.11",
        "pip",
        "autoscaler-worker",
        "useradd",
        "usermod",
    ],
)
def test_any_failing_step_shuts_the_instance_down_after_reporting_it(tmp_path, command):
    result = boot(
        tmp_path,
        "al2023",
        FAIL_COMMAND=command,
        bootstrap=worker_bootstrap(reports=FixedReportUrl()),
    )
    assert result.status != 0
    assert result.calls[-1].startswith("shutdown -h now")
    assert "systemctl enable --now autoscaler-worker" not in result.calls
    assert "FAILED while" in result.output
    if command == "curl":  # the report goes by curl too: the log says it was not sent
        assert "the failure report could not be sent" in result.output
    else:
        assert result.report is not None and result.report.startswith("FAILED while ")


@needs_bash
def test_a_wheelhouse_that_does_not_match_its_hash_is_never_installed(tmp_path):
    result = boot(
        tmp_path,
        "al2023",
        wheelhouse=b"a tampered archive",
        bootstrap=worker_bootstrap(reports=FixedReportUrl()),
    )
    assert result.shut_down and result.status != 0
    assert result.called("pip") == [] and result.called("python3.11") == []
    assert result.report is not None
    first = result.report.splitlines()[0]
    assert first.startswith("FAILED while checking the wheelhouse's sha256 (exit status 1)")
    assert "refusing to install it" in first


@needs_bash
def test_an_unsupported_image_shuts_down(tmp_path):
    result = boot(tmp_path, "debian-12")
    assert result.shut_down and "unsupported image: Debian GNU/Linux 12" in result.output
    assert result.called("apt-get") == []


@needs_bash
def test_a_gpu_type_on_an_image_without_the_nvidia_driver_reports_why_and_shuts_down(tmp_path):
    result = boot(
        tmp_path,
        "al2023",
        accelerator="nvidia",
        missing=("nvidia-smi",),
        bootstrap=worker_bootstrap(reports=FixedReportUrl()),
    )
    assert result.shut_down and "checking the NVIDIA driver" in result.output
    assert result.report is not None
    first = result.report.splitlines()[0]
    assert first.startswith("FAILED while checking the NVIDIA driver (nvidia-smi)")
    assert "nvidia-smi failed" in first and "no NVIDIA driver for this type's GPUs" in first


@needs_bash
def test_a_gpu_type_with_driver_and_toolkit_boots(tmp_path):
    result = boot(tmp_path, "al2023", accelerator="nvidia")
    assert_worker_installed(result, "python3.11")
    assert result.called("nvidia-smi") == ["nvidia-smi -L"]


def test_the_harness_never_reaches_the_real_system():
    # The stubs shadow everything that could change the host; nothing else is on PATH.
    assert {"shutdown", "poweroff", "systemctl", "useradd", "usermod", "chown"} <= set(COMMANDS)
    assert os.sep == "/"
