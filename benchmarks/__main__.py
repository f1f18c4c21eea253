"""Run benchmarks: `python -m benchmarks` (all but `faults`, which runs only when named) or
`python -m benchmarks NAME [options]`."""

from __future__ import annotations

import sys

from app.cli_io import silence_solver_banner
from autoscaler.errors import InputError
from benchmarks import (
    churn,
    daemon_scale,
    dashboard,
    faults,
    inputs,
    limits,
    lp_scaling,
    migration,
    plan_scaling,
    replay_speed,
)

BENCHMARKS = {
    "plan": plan_scaling.main,
    "churn": churn.main,
    "scale": lp_scaling.main,
    "replay": replay_speed.main,
    "daemon": daemon_scale.main,
    "migration": migration.main,
    "limits": limits.main,
    "inputs": inputs.main,
    "faults": faults.main,
    "dashboard": dashboard.main,
}
#: Run only when named: minutes of Docker containers and injected faults.
ON_REQUEST = {"faults"}

#: Commands run only when named (they write files, or need a browser).
COMMANDS = {"screenshots": dashboard.screenshots}


def main() -> None:
    silence_solver_banner()
    args = sys.argv[1:]
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        print("available:", ", ".join([*BENCHMARKS, *COMMANDS]))
        return
    try:
        if args and args[0] in BENCHMARKS:
            BENCHMARKS[args[0]](args[1:])
            return
        if args and args[0] in COMMANDS:
            COMMANDS[args[0]](args[1:])
            return
        for name, run in BENCHMARKS.items():
            if name in ON_REQUEST:
                continue
            print(f"== {name} ==")
            run(args)
    except InputError as exc:  # a file named on the command line
        print(f"benchmarks: error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
