#!/bin/bash
# Worker bootstrap: EC2 user data for every instance the autoscaler launches.
#
# Rendered by provisioners.ec2.worker_user_data, which replaces each
# double-braced placeholder below with a shell-quoted value:
#   MASTER_ADDRESS  host:port of the daemon the worker agent registers with
#   WORKER_TOKEN    bearer token the agent presents to the daemon
#   CLUSTER_ID      [ec2] cluster_id, for logs
#   AGENT_PACKAGE   pip requirement that provides the worker agent
#
# It installs Docker, installs the worker agent into its own virtualenv and
# runs it as a systemd service. The agent itself is the executor's part
# (executor/); this script only assumes its package installs an
# `autoscaler-worker` command that reads the environment file written below.
set -euo pipefail

MASTER_ADDRESS={{MASTER_ADDRESS}}
WORKER_TOKEN={{WORKER_TOKEN}}
CLUSTER_ID={{CLUSTER_ID}}
AGENT_PACKAGE={{AGENT_PACKAGE}}

log() { echo "autoscaler-bootstrap: $*" | tee -a /var/log/autoscaler-bootstrap.log; }

# Instance identity through IMDSv2 (a session token first, then the metadata).
imds() {
  local token
  token=$(curl -fsS -X PUT "http://169.254.169.254/latest/api/token" \
    -H "X-aws-ec2-metadata-token-ttl-seconds: 300")
  curl -fsS -H "X-aws-ec2-metadata-token: ${token}" "http://169.254.169.254/latest/meta-data/$1"
}
INSTANCE_ID=$(imds instance-id)
INSTANCE_TYPE=$(imds instance-type)
log "instance ${INSTANCE_ID} (${INSTANCE_TYPE}) of cluster ${CLUSTER_ID}"

install_packages() {
  if command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q docker.io python3-venv curl
  elif command -v dnf >/dev/null; then
    dnf install -y -q docker python3 curl
  else
    log "no apt-get or dnf: cannot install Docker"
    exit 1
  fi
}

if ! command -v docker >/dev/null; then
  log "installing Docker"
  install_packages
fi
systemctl enable --now docker

log "installing the worker agent (${AGENT_PACKAGE})"
python3 -m venv /opt/autoscaler-worker
/opt/autoscaler-worker/bin/pip install --quiet "${AGENT_PACKAGE}"

# The token is a secret: readable by root only, never on a command line.
install -d -m 0700 /etc/autoscaler-worker
umask 077
cat > /etc/autoscaler-worker/env <<ENV
AUTOSCALER_MASTER_ADDRESS=${MASTER_ADDRESS}
AUTOSCALER_WORKER_TOKEN=${WORKER_TOKEN}
AUTOSCALER_CLUSTER_ID=${CLUSTER_ID}
AUTOSCALER_INSTANCE_ID=${INSTANCE_ID}
AUTOSCALER_INSTANCE_TYPE=${INSTANCE_TYPE}
ENV

cat > /etc/systemd/system/autoscaler-worker.service <<'UNIT'
[Unit]
Description=Autoscaler worker agent
After=docker.service network-online.target
Requires=docker.service
Wants=network-online.target

[Service]
EnvironmentFile=/etc/autoscaler-worker/env
ExecStart=/opt/autoscaler-worker/bin/autoscaler-worker
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
UNIT

systemctl daemon-reload
systemctl enable --now autoscaler-worker
log "worker agent started; registering with ${MASTER_ADDRESS}"
