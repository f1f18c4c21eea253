"""`autoscaler deploy policy` and `autoscaler deploy wheelhouse`: what an account needs
before the daemon's first run on EC2.

`policy` writes the daemon's and the workers' IAM policies and the bucket's lifecycle
rule for one configuration (`provisioners.policy`): its bucket and prefix, images,
subnets, security groups, region and cluster id. `wheelhouse` builds what workers install
at boot, offline: the worker agent's wheel and every dependency, hash-pinned
(`provisioners.wheelhouse`); the daemon publishes it to the cluster's bucket.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from app.config import ClusterConfig, load_cluster_config


def register(sub: argparse._SubParsersAction) -> None:
    deploy = sub.add_parser(
        "deploy",
        help="write the cluster's IAM policies, or build the workers' wheelhouse",
        description="What an AWS account needs before the daemon runs: the IAM policies and "
        "S3 lifecycle rule of this cluster, and the wheelhouse its workers install from.",
    )
    actions = deploy.add_subparsers(dest="deploy_action", required=True, metavar="ACTION")

    policy = actions.add_parser(
        "policy",
        help="write the daemon's and workers' IAM policies and the S3 lifecycle rule",
        description="Write daemon-iam-policy.json, worker-iam-policy.json and "
        "s3-lifecycle.json for the cluster of --config: scoped to its bucket and prefix, "
        "images, subnets, security groups, region and cluster id.",
    )
    _config(policy)
    policy.add_argument(
        "--out", type=Path, default=None, help="directory to write to (default: DIR/policies)"
    )
    policy.add_argument(
        "--worker-role",
        default=None,
        help="the workers' role, if not named like [ec2] iam_instance_profile",
    )
    policy.add_argument(
        "--expire-days",
        type=int,
        default=None,
        help="days after which S3 expires jobs' objects and boot reports (default 30)",
    )
    policy.set_defaults(func=cmd_deploy_policy)

    wheelhouse = actions.add_parser(
        "wheelhouse",
        help="build the worker agent and its dependencies, hash-pinned, for offline installs",
        description="Build the worker agent's wheel (python -m executor.distribution) and "
        "download every dependency (pip download, binary wheels for each target interpreter "
        "and platform) into DIR, with requirements.txt pinning each file by its sha256. "
        "Workers install from it with --no-index --require-hashes: no package index at boot.",
    )
    wheelhouse.add_argument("--out", type=Path, required=True, help="directory to build into")
    wheelhouse.add_argument(
        "--find-links",
        action="append",
        default=[],
        metavar="DIR",
        help="also look for wheels here (a local mirror); repeatable",
    )
    wheelhouse.add_argument(
        "--no-index",
        action="store_true",
        help="use --find-links only, never a package index",
    )
    wheelhouse.add_argument(
        "--python",
        action="append",
        default=None,
        metavar="X.Y",
        help="target interpreter versions (default: 3.11 and 3.12, the images' Pythons)",
    )
    wheelhouse.add_argument(
        "--platform",
        action="append",
        default=None,
        metavar="TAG",
        help="target platform tags (default: manylinux x86_64 and aarch64)",
    )
    wheelhouse.set_defaults(func=cmd_deploy_wheelhouse)


def _config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", default=None, help="cluster configuration (default $AUTOSCALER_CONFIG)"
    )


def write_cluster_policies(
    config: ClusterConfig,
    out: Path | None = None,
    *,
    worker_role: str | None = None,
    expire_days: int | None = None,
) -> list[Path]:
    """The cluster's policies and lifecycle rule, written into `out` (DIR/policies)."""
    from provisioners.policy import DEFAULT_EXPIRE_DAYS, write_policies

    return write_policies(
        out or config.path.parent / "policies",
        config.provisioner.ec2,
        config.storage.url,
        worker_role=worker_role,
        expire_days=expire_days or DEFAULT_EXPIRE_DAYS,
    )


def cmd_deploy_policy(args: argparse.Namespace) -> int:
    config = load_cluster_config(args.config)
    written = write_cluster_policies(
        config, args.out, worker_role=args.worker_role, expire_days=args.expire_days
    )
    for path in written:
        print(f"wrote {path}")
    daemon, _, lifecycle = written
    bucket = config.storage.url.removeprefix("s3://").split("/", 1)[0]
    print(
        "\nnext: attach the daemon's policy to the role or user the daemon runs as, e.g.\n"
        f"  aws iam put-role-policy --role-name autoscaler-daemon --policy-name "
        f"{config.cluster.name} --policy-document file://{daemon}\n"
        "and set the bucket's lifecycle rule:\n"
        f"  aws s3api put-bucket-lifecycle-configuration --bucket {bucket} "
        f"--lifecycle-configuration file://{lifecycle}"
    )
    return 0


def cmd_deploy_wheelhouse(args: argparse.Namespace) -> int:
    from executor.distribution import build
    from provisioners.wheelhouse import DEFAULT_PLATFORMS, DEFAULT_PYTHONS, build_wheelhouse

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    worker = build(out)
    house = build_wheelhouse(
        out,
        worker.path,
        pythons=tuple(args.python or DEFAULT_PYTHONS),
        platforms=tuple(args.platform or DEFAULT_PLATFORMS),
        find_links=tuple(args.find_links),
        index=not args.no_index,
    )
    print(f"wrote {house.requirements} ({len(house.files)} wheels, sha256 {house.sha256})")
    print(f'\nnext: set [cloud] wheelhouse = "{out}" in the cluster configuration')
    return 0
