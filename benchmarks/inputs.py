"""How long a large trace takes to read, and to be refused for one bad value at its end.

`python -m benchmarks inputs [--jobs 300000 1000000]` synthesizes a trace of each size
from the bundled one (as `autoscaler trace synthesize` does), writes it compact, and
times `load_jobs` (decode, schema, duplicate-key check, jobs built, catalog check) on
it as it is, and with the last job's duration replaced by a string: the bad one must be
refused in one line within 5 s at 300,000 jobs and 15 s at 1,000,000.

Measured on this 2-core machine, shared (load about 3): 300,000 jobs (95 MB) read in
7.1 s, the bad one refused in 2.2 s (2.9-3.0 s end to end, `autoscaler plan --jobs`);
1,000,000 jobs (318 MB) read in 24.7 s, refused in 7.2 s (8.4 s end to end). Before
the strict schemas: 300,000 jobs read in 13.1-18.6 s, refused in 14.7-16.1 s.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import orjson

from app.bundled import bundled
from app.files import load_catalog, load_jobs
from autoscaler.errors import InputError
from simulator.traces import synthesize

#: What the issue asks: refusing the bad job within these seconds, by trace size.
LIMITS_S = {300_000: 5.0, 1_000_000: 15.0}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks inputs")
    parser.add_argument("--jobs", type=int, nargs="+", default=[300_000])
    args = parser.parse_args(argv)
    catalog = load_catalog(bundled("ec2_config.json"))
    source = load_jobs(bundled("pai_200.json"), catalog)
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.jobs:
            trace = synthesize(source, n, seed=1)
            good = Path(tmp) / f"good-{n}.json"
            good.write_bytes(orjson.dumps(trace))
            trace[str(n - 1)]["duration"] = "x"
            bad = Path(tmp) / f"bad-{n}.json"
            bad.write_bytes(orjson.dumps(trace))
            del trace
            started = time.perf_counter()
            jobs = load_jobs(good, catalog)
            valid_s = time.perf_counter() - started
            started = time.perf_counter()
            try:
                load_jobs(bad, catalog)
            except InputError as exc:
                refused_s = time.perf_counter() - started
                message = str(exc).split(": ", 1)[1]
            else:
                raise AssertionError("the bad trace was accepted")
            limit = LIMITS_S.get(n)
            verdict = (
                ""
                if limit is None
                else f" (limit {limit:g} s: {'ok' if refused_s < limit else 'OVER'})"
            )
            print(
                f"{n:>9,} jobs, {good.stat().st_size / 1e6:,.0f} MB: read {len(jobs):,} jobs in "
                f"{valid_s:.2f} s; the bad one refused in {refused_s:.2f} s{verdict}: {message}"
            )
