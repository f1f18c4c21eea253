"""The `Cloud` bindings: `ec2` (boto3) and `local` (worker agents on this host, whose
containers it finds by the executor's labels, and whose spot reclaims `local_reclaims`
emulates); the instance `catalog` and its prices (`spot_prices`: spot prices from
`DescribeSpotPriceHistory`, cached and dated);
`bootstrap` (a worker's EC2 user data); `config` (the `[ec2]` and `[guardrails]` tables);
`documents` (how every file is read: strict msgspec schemas, bounded reads, one-line
errors — the application reads users' files by the same rules).

Each cloud also says how its workers prove their instance when they enroll (an
`executor.enrollment.IdentityVerifier`): `identity` checks EC2's signed instance
identity document against AWS's certificate of the region and the launch the state
recorded; `local.LocalCloud.verify` accepts each agent's one-time secret once."""

import logging

# A library logs; the application decides where it goes. Without this, Python's
# last-resort handler would print every warning to stderr of every command.
logging.getLogger(__name__).addHandler(logging.NullHandler())
