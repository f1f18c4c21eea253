"""PID 1 of the stand-in instance (stdlib only: it runs on the image's bare interpreter).

The container has a network namespace of its own with nothing but loopback, as an
instance has only its VPC: this gives it the addresses an instance dials — the
metadata service's 169.254.169.254:80, the daemon's and S3's (moto's) — each a TCP
listener piping to a Unix socket in /net, where the test's end (`tests/e2e/instance.py`,
`Links`) connects to the real service. Then it runs the user data with bash, as
cloud-init would, writes its exit status to /var/log/user-data.status, and stays up: the
agent the bootstrap started lives as long as the machine.

    python3 instance_init.py USER_DATA IP:PORT=SOCKET_NAME ...
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time


def pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (sink, source):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)


def serve(ip: str, port: int, path: str) -> None:
    listener = socket.create_server((ip, port), reuse_port=False)
    while True:
        conn, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(path)
        except OSError:
            conn.close()
            continue
        threading.Thread(target=pipe, args=(conn, upstream), daemon=True).start()
        threading.Thread(target=pipe, args=(upstream, conn), daemon=True).start()


def main(user_data: str, links: list[str]) -> None:
    for link in links:
        address, _, name = link.partition("=")
        ip, _, port = address.rpartition(":")
        if not ip.startswith("127."):
            subprocess.run(["ip", "addr", "add", f"{ip}/32", "dev", "lo"], check=True)
        threading.Thread(target=serve, args=(ip, int(port), f"/net/{name}"), daemon=True).start()
    time.sleep(0.2)  # the listeners are bound before the script dials them
    with open("/var/log/cloud-init-output.log", "ab") as log:
        status = subprocess.run(["/bin/bash", user_data], stdout=log, stderr=log).returncode
    with open("/var/log/user-data.status", "w") as out:
        out.write(f"{status}\n")
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
