#!/usr/bin/env bash
# Build the daemon's image from this checkout: wheels made here, nothing fetched in the build.
#
#   deploy/build-image.sh                                 # FROM python:3.11-slim
#   BASE=autoscaler/python:3.11 deploy/build-image.sh     # FROM a base made on this host
#   TAG=registry.example/autoscaler:0.1.0 deploy/build-image.sh
#
# BASE    the base image (default python:3.11-slim; any CPython 3.11 with a `sh`)
# TAG     the image's name (default autoscaler/daemon:VERSION)
# PYTHON  the interpreter whose pip builds the wheels: Python 3.11 on x86-64 Linux,
#         the base's version and platform (default: python3)
#
# `pip wheel` runs on the host (it may use a package index or a local wheelhouse there);
# the Dockerfile then installs from those wheels with --no-index. The workers' wheelhouse
# (`autoscaler deploy wheelhouse`) is built here too and shipped at
# /opt/autoscaler/share/wheelhouse, which deploy/compose/*.toml name: the daemon publishes
# the agent of its own version. Prints the image id.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
BASE=${BASE:-python:3.11-slim}

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "build-image: $PYTHON is not Python 3.11: its wheels would not fit the image's" \
       "interpreter (set PYTHON=python3.11)" >&2
  exit 2
fi
VERSION=$("$PYTHON" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
  "$ROOT/pyproject.toml")
TAG=${TAG:-autoscaler/daemon:$VERSION}

CONTEXT=$(mktemp -d "${TMPDIR:-/tmp}/autoscaler-image.XXXXXX")
trap 'rm -rf "$CONTEXT"' EXIT
echo "build-image: wheels of the project and its dependencies (pip wheel) ..." >&2
# From a copy without build/ and dist/: setuptools reuses a stale build/ directory, so a
# module deleted from the tree (an old migration) would otherwise ship in the image.
mkdir "$CONTEXT/source"
tar -C "$ROOT" --exclude=./build --exclude=./dist --exclude='./.venv*' --exclude=./.git \
  --exclude='*.egg-info' -cf - . | tar -C "$CONTEXT/source" -xf -
"$PYTHON" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$CONTEXT/wheels" \
  "$CONTEXT/source" pip >&2
echo "build-image: the workers' wheelhouse (agent and dependencies, hash-pinned) ..." >&2
# Standard library and pip only: run from the source copy, whatever $PYTHON has installed.
PYTHONPATH="$CONTEXT/source" "$PYTHON" -m executor.distribution --out "$CONTEXT/wheelhouse" >&2
PYTHONPATH="$CONTEXT/source" "$PYTHON" -m provisioners.wheelhouse --out "$CONTEXT/wheelhouse" >&2
cp "$ROOT/deploy/Dockerfile" "$CONTEXT/Dockerfile"
echo "build-image: docker build -t $TAG (FROM $BASE) ..." >&2
docker build --quiet --build-arg "BASE=$BASE" --label "org.opencontainers.image.version=$VERSION" \
  --tag "$TAG" "$CONTEXT"
