#!/bin/bash
# Worker bootstrap: the EC2 user data of one instance the autoscaler launches.
#
# Rendered for each launch by provisioners.bootstrap.WorkerBootstrap.render, which
# replaces each double-braced placeholder below with a shell-quoted value:
#   DAEMON_ADDRESS   host:port of the daemon the worker enrolls with
#   CA_PEM           the cluster's server CA certificate (public): the daemon must present
#                    a certificate it signed, for the name autoscaler-daemon
#   CLUSTER_ID       [ec2] cluster_id
#   REGION           the AWS region
#   INSTANCE_ID      the autoscaler's id for this instance (its launch token)
#   WHEELHOUSE_URL   short-lived (presigned) URL of the workers' wheelhouse: the agent and
#                    every dependency as wheels, with requirements.txt pinning their hashes
#   WHEELHOUSE_SHA256 the archive's sha256: nothing is installed unless it matches
#   REPORT_URL       short-lived (presigned) URL this script PUTs its failure report to,
#                    under the cluster's prefix, where the daemon reads it ("" for none)
#   ACCELERATOR      "nvidia" for NVIDIA GPU types (driver and toolkit checked), else ""
#   THROUGHPUT_WINDOW seconds jobs report throughput over: one round of the cluster
#
# No secret is in user data (anything reaching the metadata service, or
# DescribeInstanceAttribute, can read it), and none is needed: the agent proves this
# instance to the daemon with the identity document AWS signs for it (IMDSv2), and gets
# a short-lived client certificate in exchange.
#
# Supported images: Amazon Linux 2023 (dnf) and Ubuntu 22.04 / 24.04 (apt); the NVIDIA
# Deep Learning Base AMI is Amazon Linux 2023 with the driver and container toolkit.
#
# The agent is installed offline: pip reads only the wheelhouse (--no-index) and refuses any
# file whose hash requirements.txt does not pin (--require-hashes), so a private subnet with
# an S3 gateway endpoint and the image's package mirror is enough.
#
# Any failure shuts the instance down, after a one-line report of the step that failed and
# why (with the tail of this script's log) is PUT to REPORT_URL: the daemon records it as
# the reason the instance never registered. The autoscaler launches the instance with
# InstanceInitiatedShutdownBehavior=terminate, so a failed bootstrap stops billing at once
# instead of waiting for the daemon's registration timeout.
set -Eeuo pipefail

DAEMON_ADDRESS={{DAEMON_ADDRESS}}
CA_PEM={{CA_PEM}}
CLUSTER_ID={{CLUSTER_ID}}
REGION={{REGION}}
INSTANCE_ID={{INSTANCE_ID}}
WHEELHOUSE_URL={{WHEELHOUSE_URL}}
WHEELHOUSE_SHA256={{WHEELHOUSE_SHA256}}
REPORT_URL={{REPORT_URL}}
ACCELERATOR={{ACCELERATOR}}
THROUGHPUT_WINDOW={{THROUGHPUT_WINDOW}}
ORPHAN_TIMEOUT={{ORPHAN_TIMEOUT}}
ORPHAN_MAX={{ORPHAN_MAX}}

# Tests run the script against a scratch directory; on an instance this is empty.
ROOT=${AUTOSCALER_BOOTSTRAP_ROOT:-}
WORKER_USER=autoscaler-worker
VENV=/opt/autoscaler-worker
STATE_DIR=/var/lib/autoscaler-worker
CONFIG_DIR=/etc/autoscaler-worker
LOG_FILE=$ROOT/var/log/autoscaler-bootstrap.log

mkdir -p "$(dirname "$LOG_FILE")"
log() { echo "autoscaler-bootstrap [$INSTANCE_ID]: $*" | tee -a "$LOG_FILE" >&2; }

STEP="starting"
REASON=""
FINISHED=0
# The failure report: what failed and why, then the log's tail; at most 4 KB.
report() {
  [ -n "$REPORT_URL" ] || return 0
  local file="${ROOT}/tmp/autoscaler-bootstrap-report.txt"
  { echo "$1"; tail -n 20 "$LOG_FILE" 2>/dev/null; } | head -c 4000 > "$file" || true
  curl -fsS --connect-timeout 5 --max-time 30 -X PUT -H "Content-Type: text/plain" \
    --data-binary "@$file" "$REPORT_URL" >/dev/null 2>&1 || log "the failure report could not be sent"
}
on_exit() {
  local status=$?
  if [ "$FINISHED" != 1 ]; then
    local why="FAILED while ${STEP} (exit status ${status})${REASON:+: ${REASON}}"
    log "${why}; shutting the instance down"
    report "$why"
    shutdown -h now "autoscaler worker bootstrap failed while ${STEP}" || poweroff -f
  fi
}
trap on_exit EXIT
step() { STEP=$*; log "$*"; }
# Stop with a reason the report carries.
fail() { REASON=$*; log "$*"; exit 1; }

# A command, retried: package mirrors and first-boot locks come and go.
retry() {
  local attempt
  for attempt in 1 2 3 4 5; do
    if "$@"; then return 0; fi
    log "attempt ${attempt} of '$*' failed; retrying"
    sleep $((attempt * 5))
  done
  "$@"
}

# Ubuntu runs apt (unattended-upgrades, cloud-init) on first boot: wait for its locks.
apt_get() { apt-get -o DPkg::Lock::Timeout=600 -q -y "$@"; }

step "reading the operating system"
# shellcheck disable=SC1091
. "$ROOT/etc/os-release"
case "${ID:-}:${VERSION_ID:-}" in
  amzn:2023)
    step "installing Docker and Python 3.11 (dnf)"
    # Not curl: AL2023 ships curl-minimal, which conflicts with the curl package.
    retry dnf install -y -q docker python3.11 python3.11-pip tar
    PYTHON=python3.11
    ;;
  ubuntu:22.04)
    step "installing Docker and Python 3.11 (apt)"
    export DEBIAN_FRONTEND=noninteractive
    retry apt_get update
    retry apt_get install --no-install-recommends docker.io python3.11 python3.11-venv curl ca-certificates
    PYTHON=python3.11
    ;;
  ubuntu:24.04)
    step "installing Docker and Python (apt)"
    export DEBIAN_FRONTEND=noninteractive
    retry apt_get update
    retry apt_get install --no-install-recommends docker.io python3-venv curl ca-certificates
    PYTHON=python3.12
    ;;
  *)
    fail "unsupported image: ${PRETTY_NAME:-${ID:-unknown}} (Amazon Linux 2023, Ubuntu 22.04 or 24.04)"
    ;;
esac

step "starting Docker"
systemctl enable --now docker
docker info >/dev/null || fail "the Docker daemon does not answer after starting it"

if [ "$ACCELERATOR" = nvidia ]; then
  step "checking the NVIDIA driver (nvidia-smi)"
  if ! GPUS=$(nvidia-smi -L 2>&1); then
    fail "nvidia-smi failed (${GPUS//$'\n'/ }): this image has no NVIDIA driver for this" \
      "type's GPUs; give its family an image that has one ([ec2.ami])"
  fi
  log "GPUs: ${GPUS//$'\n'/; }"
  step "checking the NVIDIA container toolkit"
  command -v nvidia-ctk >/dev/null ||
    fail "no NVIDIA container toolkit (nvidia-ctk): use an image with it for this type ([ec2.ami])"
fi

step "downloading the worker's wheelhouse"
WORK=$(mktemp -d "${ROOT}/tmp/autoscaler-wheelhouse.XXXXXX")
retry curl -fsS --connect-timeout 10 --max-time 600 -o "$WORK/wheelhouse.tar" "$WHEELHOUSE_URL"
step "checking the wheelhouse's sha256"
echo "$WHEELHOUSE_SHA256  $WORK/wheelhouse.tar" | sha256sum -c - >/dev/null ||
  fail "the wheelhouse's sha256 is not ${WHEELHOUSE_SHA256}: refusing to install it"
mkdir -p "$WORK/wheels"
tar -xf "$WORK/wheelhouse.tar" -C "$WORK/wheels"

step "installing the worker agent offline (every file pinned by its hash)"
"$PYTHON" -m venv "$ROOT$VENV"
"$ROOT$VENV/bin/pip" install --isolated --quiet --no-input --disable-pip-version-check \
  --no-index --find-links "$WORK/wheels" --require-hashes -r "$WORK/wheels/requirements.txt"
"$ROOT$VENV/bin/autoscaler-worker" --help >/dev/null
rm -rf "$WORK"

step "creating the unprivileged user ${WORKER_USER} (group docker)"
if ! id -u "$WORKER_USER" >/dev/null 2>&1; then
  useradd --system --home-dir "$STATE_DIR" --shell /usr/sbin/nologin "$WORKER_USER"
fi
usermod -a -G docker "$WORKER_USER"
install -d -m 0750 "$ROOT$STATE_DIR"
chown "$WORKER_USER:" "$ROOT$STATE_DIR"

step "writing the worker's configuration (no secret in it)"
install -d -m 0755 "$ROOT$CONFIG_DIR"
printf '%s\n' "$CA_PEM" > "$ROOT$CONFIG_DIR/ca.pem"
chmod 0644 "$ROOT$CONFIG_DIR/ca.pem"
cat > "$ROOT$CONFIG_DIR/env" <<ENV
AUTOSCALER_CLUSTER_ID=$CLUSTER_ID
AUTOSCALER_INSTANCE_ID=$INSTANCE_ID
AUTOSCALER_DAEMON=$DAEMON_ADDRESS
AWS_REGION=$REGION
AWS_DEFAULT_REGION=$REGION
ENV
install -d -m 0755 "$ROOT/etc/systemd/system"
cat > "$ROOT/etc/systemd/system/autoscaler-worker.service" <<UNIT
[Unit]
Description=Autoscaler worker agent (cluster ${CLUSTER_ID})
After=docker.service network-online.target
Requires=docker.service
Wants=network-online.target

[Service]
User=${WORKER_USER}
Group=${WORKER_USER}
SupplementaryGroups=docker
EnvironmentFile=${CONFIG_DIR}/env
WorkingDirectory=${STATE_DIR}
ExecStart=${VENV}/bin/autoscaler-worker --daemon \${AUTOSCALER_DAEMON} --ca ${CONFIG_DIR}/ca.pem --imds --instance-id \${AUTOSCALER_INSTANCE_ID} --work-dir ${STATE_DIR} --stop-tasks --orphan-timeout ${ORPHAN_TIMEOUT} --orphan-max ${ORPHAN_MAX} --throughput-window ${THROUGHPUT_WINDOW}
# On SIGTERM (the instance shutting down: scale-in, drain, down) the agent checkpoints
# and stops its tasks first: their checkpoint wait, grace and upload take up to ~2 min.
TimeoutStopSec=180
Restart=always
RestartSec=5
NoNewPrivileges=true

[Install]
WantedBy=multi-user.target
UNIT

step "starting the worker agent"
systemctl daemon-reload
systemctl enable --now autoscaler-worker
FINISHED=1
log "worker agent started; it enrolls with ${DAEMON_ADDRESS}"
