#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine, for the local cloud
# (`autoscaler init --local`): its instances are worker agents here and its tasks are
# containers on this engine.
#
#   deploy/local-docker.sh
#
# If an engine already answers (DOCKER_HOST, else the default socket), it does nothing.
# Otherwise, on Debian or Ubuntu, it installs docker.io (and busybox-static, which the
# local Python base image needs: `executor/images.py`) if missing and starts dockerd on the
# default socket, with no bridge and no iptables rules: containers get no network unless a
# job asks for one, and nothing on the host's firewall changes. Its log goes to
# /var/log/autoscaler-dockerd.log. Stop it with `kill $(cat /var/run/docker.pid)`.
set -Eeuo pipefail

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

answers() { docker info >/dev/null 2>&1; }

if command -v docker >/dev/null && answers; then
    if [ ! -x /bin/busybox ]; then
        echo "local-docker: installing busybox-static (for the local Python base image)"
        $SUDO apt-get install -y --no-install-recommends busybox-static >/dev/null \
            || { $SUDO apt-get update >/dev/null \
                 && $SUDO apt-get install -y --no-install-recommends busybox-static >/dev/null; }
    fi
    echo "local-docker: a Docker engine already answers ($(docker info --format '{{.ServerVersion}}'))"
    exit 0
fi

if ! command -v dockerd >/dev/null || [ ! -x /bin/busybox ]; then
    echo "local-docker: installing docker.io and busybox-static (Debian packages)"
    $SUDO apt-get install -y --no-install-recommends docker.io busybox-static >/dev/null \
        || { $SUDO apt-get update >/dev/null \
             && $SUDO apt-get install -y --no-install-recommends docker.io busybox-static >/dev/null; }
fi

if [ -n "${DOCKER_HOST:-}" ]; then
    echo "local-docker: DOCKER_HOST=$DOCKER_HOST does not answer; unset it to use the engine" \
         "this script starts on the default socket" >&2
    exit 1
fi

LOG=/var/log/autoscaler-dockerd.log
start() {
    $SUDO sh -c "nohup dockerd --storage-driver=$1 --iptables=false --ip6tables=false \
        --bridge=none >>$LOG 2>&1 &"
    for _ in $(seq 1 100); do
        if $SUDO docker info >/dev/null 2>&1; then return 0; fi
        sleep 0.3
    done
    return 1
}
stop() {
    if [ -f /var/run/docker.pid ]; then $SUDO kill "$(cat /var/run/docker.pid)" 2>/dev/null || true; fi
    sleep 2
}

echo "local-docker: starting dockerd (log: $LOG)"
# overlay2 where the kernel and filesystem allow it; vfs (slower, always works) otherwise.
if start overlay2 || { stop; start vfs; }; then
    echo "local-docker: Docker $($SUDO docker info --format '{{.ServerVersion}}') answers" \
         "on the default socket"
else
    echo "local-docker: dockerd did not start; its log:" >&2
    tail -n 20 "$LOG" >&2 || true
    exit 1
fi
if [ "$(id -u)" != 0 ] && ! docker info >/dev/null 2>&1; then
    echo "local-docker: add yourself to the docker group (sudo usermod -aG docker $USER)" \
         "and log in again" >&2
fi
