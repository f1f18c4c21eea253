"""A stand-in EC2 instance for the worker bootstrap: a container the user data runs in.

The image is made on this host, with no registry: the Python base of `executor.images`
plus what an Amazon Linux 2023 host has that the base lacks — bash and curl (the host's
binaries and the libraries `ldd` lists), `ensurepip` with its bundled wheels (pip runs for
real, into a virtualenv, offline), and `/etc/os-release` of AL2023. What only a machine has
is played by small stubs that append each call to `/var/log/host-calls.log`: `dnf` (the
packages are already there), `useradd`/`usermod` (which do edit /etc/passwd and
/etc/group), `shutdown`/`poweroff`, `docker info` (asks the real engine, whose socket is
mounted where Docker's is), and `systemctl`, which starts a unit's `ExecStart` as its
`User` with its `EnvironmentFile`, as systemd would.

The container has its own network namespace with loopback only (`instance_init.py`); each
address the instance dials is linked to the real service by a Unix socket (`Links`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executor.images import PYTHON_IMAGE, _shared_libraries

HERE = Path(__file__).resolve().parent
#: Tagged with this file's hash: a change to the stubs makes a new image.
IMAGE = "autoscaler/al2023-standin:" + hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
DOCKER_SOCKET = "/var/run/docker.sock"
CALLS = "/var/log/host-calls.log"

OS_RELEASE = """NAME="Amazon Linux"
VERSION="2023"
ID="amzn"
ID_LIKE="fedora"
VERSION_ID="2023"
PRETTY_NAME="Amazon Linux 2023 (stand-in)"
"""

RECORD = f"""#!/bin/sh
echo "$(basename "$0") $*" >> {CALLS}
"""

USERADD = f"""#!/usr/bin/python3
import sys
with open({CALLS!r}, "a") as log:
    log.write("useradd " + " ".join(sys.argv[1:]) + "\\n")
name = sys.argv[-1]
home = sys.argv[sys.argv.index("--home-dir") + 1]
with open("/etc/passwd", "a") as f:
    f.write(f"{{name}}:x:999:999::{{home}}:/usr/sbin/nologin\\n")
with open("/etc/group", "a") as f:
    f.write(f"{{name}}:x:999:\\n")
"""

USERMOD = f"""#!/usr/bin/python3
import sys
with open({CALLS!r}, "a") as log:
    log.write("usermod " + " ".join(sys.argv[1:]) + "\\n")
group, user = sys.argv[sys.argv.index("-G") + 1], sys.argv[-1]
lines = open("/etc/group").read().splitlines()
out = []
for line in lines:
    parts = line.split(":")
    if parts[0] == group:
        members = [m for m in parts[3].split(",") if m] + [user]
        parts[3] = ",".join(members)
    out.append(":".join(parts))
open("/etc/group", "w").write("\\n".join(out) + "\\n")
"""

DOCKER = f"""#!/usr/bin/python3
import http.client, socket, sys
with open({CALLS!r}, "a") as log:
    log.write("docker " + " ".join(sys.argv[1:]) + "\\n")
if sys.argv[1:2] != ["info"]:
    sys.exit("docker stand-in: only `docker info`")
class Conn(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect({DOCKER_SOCKET!r})
conn = Conn("docker")
conn.request("GET", "/info")
sys.exit(0 if conn.getresponse().status == 200 else 1)
"""

SYSTEMCTL = f"""#!/usr/bin/python3
import grp, os, pwd, re, shlex, subprocess, sys
with open({CALLS!r}, "a") as log:
    log.write("systemctl " + " ".join(sys.argv[1:]) + "\\n")
args = sys.argv[1:]
if args[:2] != ["enable", "--now"] or args[2] == "docker":
    sys.exit(0)
unit = {{}}
for line in open(f"/etc/systemd/system/{{args[2]}}.service"):
    key, sep, value = line.strip().partition("=")
    if sep:
        unit[key] = value
env = {{"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8"}}
for line in open(unit["EnvironmentFile"]):
    key, sep, value = line.strip().partition("=")
    if sep:
        env[key] = value
command = re.sub(r"\\$\\{{(\\w+)\\}}", lambda m: env[m.group(1)], unit["ExecStart"])
user = pwd.getpwnam(unit["User"])
groups = [grp.getgrnam(g).gr_gid for g in unit.get("SupplementaryGroups", "").split()]
env["HOME"] = user.pw_dir
def drop():
    os.setgroups(groups)
    os.setgid(grp.getgrnam(unit["Group"]).gr_gid)
    os.setuid(user.pw_uid)
log = open(f"/var/log/{{args[2]}}.log", "ab")
subprocess.Popen(shlex.split(command), env=env, cwd=unit["WorkingDirectory"],
                 stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=drop,
                 start_new_session=True)
"""


def _build_context(root: Path, docker_gid: int) -> None:
    files = root / "rootfs"
    stubs = {
        "usr/bin/dnf": RECORD,
        "usr/sbin/shutdown": RECORD,
        "usr/sbin/poweroff": RECORD,
        "usr/sbin/useradd": USERADD,
        "usr/sbin/usermod": USERMOD,
        "usr/bin/docker": DOCKER,
        "usr/bin/systemctl": SYSTEMCTL,
    }
    for path, text in stubs.items():
        target = files / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(0o755)
    (files / "etc").mkdir(parents=True, exist_ok=True)
    (files / "etc/os-release").write_text(OS_RELEASE)
    for binary in ("/usr/bin/bash", "/usr/bin/curl", "/usr/bin/install"):
        for path in sorted({binary} | _shared_libraries([binary])):
            target = files / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(os.path.realpath(path), target)
    shutil.copytree("/usr/lib/python3.11/ensurepip", files / "usr/lib/python3.11/ensurepip")
    if Path("/usr/share/python-wheels").is_dir():
        shutil.copytree("/usr/share/python-wheels", files / "usr/share/python-wheels")
    (root / "Dockerfile").write_text(
        f"FROM {PYTHON_IMAGE}\n"
        "COPY rootfs/ /\n"
        # The base's /bin/sh, /usr/bin/python3 stay; docker's group as the host's socket has it.
        f'RUN echo "docker:x:{docker_gid}:" >> /etc/group && mkdir -p /var/log /net '
        "/usr/sbin /opt /var/lib /run && ln -s /usr/bin/bash /bin/bash\n"
        'ENV PATH="/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"\n'
    )


def ensure_instance_image(client: Any, docker_socket: str) -> str:
    """Build the stand-in image (once per engine: kept like the base image)."""
    try:
        return str(client.images.get(IMAGE).id)
    except Exception:
        pass
    with tempfile.TemporaryDirectory(prefix="al2023-") as scratch:
        _build_context(Path(scratch), os.stat(docker_socket).st_gid)
        image, _ = client.images.build(path=scratch, tag=IMAGE, rm=True, network_mode="none")
    return str(image.id)


@dataclass
class Links:
    """The test's end of the instance's network: one Unix socket per address, each
    connection to it piped to the real service's TCP address."""

    directory: Path
    links: dict[str, tuple[str, str]] = field(default_factory=dict)  # ip:port -> (name, target)
    _servers: list[socket.socket] = field(default_factory=list)

    def add(self, seen_as: str, target: str) -> None:
        name = f"link{len(self.links)}.sock"
        path = self.directory / name
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
        path.chmod(0o777)
        server.listen(64)
        self._servers.append(server)
        self.links[seen_as] = (name, target)
        host, _, port = target.rpartition(":")
        threading.Thread(target=self._serve, args=(server, host, int(port)), daemon=True).start()

    def _serve(self, server: socket.socket, host: str, port: int) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection((host, port), timeout=10)
                upstream.settimeout(None)
            except OSError:
                conn.close()
                continue
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    def arguments(self) -> list[str]:
        return [f"{seen}={name}" for seen, (name, _) in self.links.items()]

    def close(self) -> None:
        for server in self._servers:
            server.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (sink, source):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)


@dataclass
class Instance:
    """One stand-in instance running `user_data`; `read(path)` reads a file of its disk."""

    client: Any
    container: Any
    var_log: Path

    @classmethod
    def boot(
        cls, client: Any, user_data: str, links: Links, directory: Path, docker_socket: str
    ) -> Instance:
        script = directory / "user-data"
        script.write_text(user_data)
        var_log = directory / "var-log"
        var_log.mkdir()
        container = client.containers.run(
            IMAGE,
            ["python3", "/test/instance_init.py", "/var/lib/cloud/user-data", *links.arguments()],
            detach=True,
            network_mode="none",
            cap_add=["NET_ADMIN"],
            volumes={
                str(script): {"bind": "/var/lib/cloud/user-data", "mode": "ro"},
                str(HERE / "instance_init.py"): {"bind": "/test/instance_init.py", "mode": "ro"},
                str(links.directory): {"bind": "/net", "mode": "rw"},
                str(var_log): {"bind": "/var/log", "mode": "rw"},
                docker_socket: {"bind": DOCKER_SOCKET, "mode": "rw"},
            },
            labels={"autoscaler-test": "worker-bootstrap"},
        )
        return cls(client, container, var_log)

    def read(self, path: str) -> str:
        """A file of its /var/log (mounted from the test's directory: readable after it stops)."""
        file = self.var_log / path.removeprefix("/var/log/")
        return file.read_text(errors="replace") if file.exists() else ""

    def calls(self) -> list[str]:
        return self.read(CALLS).splitlines()

    def status(self) -> int | None:
        """The user data's exit status once it ended, else None."""
        text = self.read("/var/log/user-data.status").strip()
        if text:
            return int(text)
        self.container.reload()
        if self.container.status == "exited":
            raise AssertionError(f"the instance stopped before its user data ended:\n{self.logs()}")
        return None

    def logs(self) -> str:
        parts = [
            self.read("/var/log/cloud-init-output.log"),
            self.read("/var/log/autoscaler-worker.log"),
            self.container.logs().decode("utf-8", "replace"),
        ]
        return "\n".join(parts)[-6000:]

    def remove(self) -> None:
        self.container.remove(force=True)


__all__ = ["IMAGE", "Instance", "Links", "ensure_instance_image"]
