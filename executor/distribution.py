"""The light worker distribution: a wheel holding the agent and only what it imports.

    python -m executor.distribution --out DIR

writes `ec2_batch_autoscaler_worker-<version>-py3-none-any.whl` to DIR: the
`executor` package, the core modules it imports (found by following its import
statements, those inside functions included, so the list cannot drift from the
code), `Requires-Dist` for only the third-party packages the worker's command
can import (with the project's own version bounds), and the `autoscaler-worker`
console script. An instance that installs it gets the agent without the planner's
numpy and HiGHS or the daemon's SQLAlchemy, pydantic and rich.

The wheel is reproducible: its entries are sorted and dated 1980-01-01, so
the same sources give the same bytes (and the same sha256 to pin).
The metadata follows the wheel format (PEP 427; binary distribution format
spec): `WHEEL`, `METADATA` (core metadata 2.1), `entry_points.txt`, and a
`RECORD` of every file's sha256 and size.
"""

from __future__ import annotations

import argparse
import ast
import base64
import hashlib
import re
import sys
import tomllib
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

#: The distribution the worker is cut from, and the one this module writes.
PROJECT = "ec2-batch-autoscaler"
NAME = "ec2-batch-autoscaler-worker"
#: What the worker ships whole, and where the modules it reaches may come from.
PACKAGE = "executor"
CORE = "autoscaler"
#: The project's other top-level packages: the worker must reach none of them.
FORBIDDEN = ("app", "provisioners", "state", "simulator")
#: Package data the agent reads at run time (besides its modules).
DATA_SUFFIXES = (".proto", ".pyi")
SCRIPT = "autoscaler-worker = executor.cli:main"
#: Where the worker starts: the console script and `python -m executor`.
RUNS = ("executor.cli", "executor.__main__")
SUMMARY = (
    "The worker agent of ec2-batch-autoscaler alone: registers with the daemon, "
    "runs and checkpoints task containers (no planner, no SQL)"
)

_DATE = (1980, 1, 1, 0, 0, 0)
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class DistributionError(RuntimeError):
    """The worker wheel cannot be built as asked; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class WorkerWheel:
    """What went into a built wheel."""

    path: Path
    modules: tuple[str, ...]  # every module shipped, dotted
    requires: tuple[str, ...]  # Requires-Dist lines
    sha256: str


def build(out: str | Path, *, root: str | Path | None = None) -> WorkerWheel:
    """Write the worker wheel into `out` and say what is in it. `root` is the directory
    holding the `executor` and `autoscaler` packages (default: where they are imported from)."""
    source = Path(root) if root is not None else Path(__file__).resolve().parent.parent
    modules = module_closure(source, package_modules(source, PACKAGE))
    # Requirements: what the command can run. Developer tools in the package (the stub
    # generator's grpc_tools) ship without pulling their dependencies onto instances.
    imported = third_party_imports(source, module_closure(source, RUNS))
    project = project_metadata(source)
    requires = requirements_for(imported, project.requires)
    version = project.version
    files = sorted(_payload(source, modules))
    dist_info = f"{_wheel_name(NAME)}-{version}.dist-info"
    meta = {
        f"{dist_info}/METADATA": _metadata(version, project.requires_python, requires),
        f"{dist_info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: executor.distribution\n"
            b"Root-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        f"{dist_info}/entry_points.txt": f"[console_scripts]\n{SCRIPT}\n".encode(),
    }
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{_wheel_name(NAME)}-{version}-py3-none-any.whl"
    record: list[str] = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for relative in files:
            data = (source / relative).read_bytes()
            _write(wheel, relative, data)
            record.append(_record_line(relative, data))
        for name, data in meta.items():
            _write(wheel, name, data)
            record.append(_record_line(name, data))
        record.append(f"{dist_info}/RECORD,,")
        _write(wheel, f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode())
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return WorkerWheel(path, tuple(sorted(modules)), tuple(requires), digest)


# -- what the worker imports -------------------------------------------------------------------


def package_modules(root: Path, package: str) -> set[str]:
    """Every module of `package` under `root` (dotted names)."""
    base = root / package
    if not (base / "__init__.py").is_file():
        raise DistributionError(f"{base}: no package {package!r} here")
    found = set()
    for path in base.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(root).with_suffix("").parts
        found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def module_closure(root: Path, start: Iterable[str]) -> set[str]:
    """`start` and every first-party module their import statements reach, transitively
    (imports inside functions too; those under `if TYPE_CHECKING:` are types, not run)."""
    first_party = {PACKAGE, CORE, *FORBIDDEN}

    def imported_by(name: str) -> Iterator[str]:
        parts = name.split(".")
        # Importing a module runs its packages' __init__ first.
        yield from (".".join(parts[:i]) for i in range(1, len(parts)))
        for target in _imports(root, name):
            if target.split(".")[0] in first_party:
                yield from _expand(root, target)

    seen = _reachable(start, imported_by)
    reached = sorted(m for m in seen if m.split(".")[0] in FORBIDDEN)
    if reached:
        raise DistributionError(
            f"the worker imports {', '.join(reached)}: it may import only "
            f"{PACKAGE} and {CORE} (the layers of ARCHITECTURE.md)"
        )
    return seen


def third_party_imports(root: Path, modules: Iterable[str]) -> set[str]:
    """The top-level names of what `modules` import from outside the project and the
    standard library."""
    project = {PACKAGE, CORE, *FORBIDDEN}
    names = set()
    for module in modules:
        for target in _imports(root, module):
            top = target.split(".")[0]
            if top not in project and top not in sys.stdlib_module_names and top != "__future__":
                names.add(top)
    return names


def _source(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(root: Path, module: str) -> Iterator[str]:
    """The absolute names a module's import statements name (`from a import b` gives
    `a` and `a.b`: b may be a module)."""
    path = _source(root, module)
    if path is None:
        raise DistributionError(f"{module}: no source under {root}")
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skipped = {
        id(node)
        for branch in ast.walk(tree)
        if isinstance(branch, ast.If) and _is_type_checking(branch.test)
        for statement in branch.body
        for node in ast.walk(statement)
    }
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")
                if not is_package:
                    package = package[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names if alias.name != "*")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _expand(root: Path, name: str) -> list[str]:
    """`name` if it is a module of ours, else nothing (`from a import b`, b a function)."""
    return [name] if _source(root, name) is not None else []


def _payload(root: Path, modules: Iterable[str]) -> Iterator[str]:
    """The files to ship: each module's source, and the package's data files."""
    for module in modules:
        path = _source(root, module)
        assert path is not None
        yield path.relative_to(root).as_posix()
    for suffix in DATA_SUFFIXES:
        for path in (root / PACKAGE).rglob(f"*{suffix}"):
            if "__pycache__" not in path.parts:
                yield path.relative_to(root).as_posix()


# -- the project's metadata and the worker's requirements --------------------------------------


@dataclass(frozen=True, slots=True)
class ProjectMetadata:
    version: str
    requires_python: str
    requires: tuple[str, ...]  # the project's run-time requirements (no extras)


def project_metadata(root: Path) -> ProjectMetadata:
    """Version and requirements of the project the worker is cut from: its
    `pyproject.toml` in a source tree, else the installed distribution's metadata."""
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
        return ProjectMetadata(
            project["version"],
            project.get("requires-python", ""),
            tuple(project.get("dependencies", ())),
        )
    try:
        installed = metadata.metadata(PROJECT)
    except metadata.PackageNotFoundError:
        raise DistributionError(
            f"no pyproject.toml under {root} and {PROJECT} is not installed: "
            "nothing says the version and requirements"
        ) from None
    requires = tuple(r for r in (metadata.requires(PROJECT) or ()) if "extra ==" not in r)
    python = (installed.get_all("Requires-Python") or [""])[0]
    return ProjectMetadata(installed["Version"], python, requires)


def requirements_for(imported: Iterable[str], project_requires: Sequence[str]) -> list[str]:
    """The project's requirements that provide the imported top-level names; a name
    provided only by a dependency of those (botocore, by boto3) needs none of its own.
    Raises when an import is provided by nothing the project requires."""
    providers = metadata.packages_distributions()
    by_name = {_normalize(_requirement_name(r)): r for r in project_requires}
    chosen: dict[str, str] = {}
    pending: list[tuple[str, set[str]]] = []
    for name in sorted(imported):
        dists = {_normalize(d) for d in providers.get(name, ())}
        direct = sorted(dists & by_name.keys())
        if direct:
            chosen.update((d, by_name[d]) for d in direct)
        else:
            pending.append((name, dists))
    unknown = sorted(name for name, dists in pending if not dists)
    if unknown:
        raise DistributionError(
            f"the worker imports {', '.join(unknown)}, not installed here: build the wheel "
            f"where {PROJECT} is installed with its dependencies"
        )
    covered = _dependencies_of(chosen)
    missing = sorted(name for name, dists in pending if not dists & covered)
    if missing:
        raise DistributionError(
            f"the worker imports {', '.join(missing)}, which no requirement of "
            f"{PROJECT} provides: add it to pyproject.toml's dependencies"
        )
    return sorted(chosen.values(), key=str.lower)


def _dependencies_of(chosen: dict[str, str]) -> set[str]:
    """The installed distributions `chosen` pulls in, transitively (their run-time ones)."""

    def required_by(dist: str) -> list[str]:
        try:
            requires = metadata.requires(dist) or []
        except metadata.PackageNotFoundError:
            return []
        names = (_requirement_name(r) for r in requires if "extra ==" not in r)
        return [_normalize(name) for name in names if name]

    return _reachable(chosen, required_by)


def _reachable(start: Iterable[str], neighbours: Callable[[str], Iterable[str]]) -> set[str]:
    """`start` and every node reachable from it through `neighbours`."""
    seen: set[str] = set()
    pending = list(start)
    while pending:
        node = pending.pop()
        if node not in seen:
            seen.add(node)
            pending += [n for n in neighbours(node) if n not in seen]
    return seen


def _requirement_name(requirement: str) -> str:
    match = _NAME.match(requirement)
    return match.group(1) if match else ""


def _normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


# -- the wheel's files --------------------------------------------------------------------------


def _wheel_name(name: str) -> str:
    """A distribution name as wheel file names spell it (PEP 427: `-` -> `_`)."""
    return re.sub(r"[-_.]+", "_", name)


def _metadata(version: str, requires_python: str, requires: Sequence[str]) -> bytes:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {NAME}",
        f"Version: {version}",
        f"Summary: {SUMMARY}",
        "License: Apache-2.0",
    ]
    if requires_python:
        lines.append(f"Requires-Python: {requires_python}")
    lines += [f"Requires-Dist: {r}" for r in requires]
    return ("\n".join(lines) + "\n").encode()


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _write(wheel: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=_DATE)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    wheel.writestr(info, data)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m executor.distribution",
        description="Build the light worker wheel (the agent and only what it imports).",
    )
    parser.add_argument("--out", required=True, type=Path, help="directory to write it to")
    args = parser.parse_args(argv)
    try:
        wheel = build(args.out)
    except DistributionError as exc:
        print(f"executor.distribution: error: {exc}", file=sys.stderr)
        return 1
    print(wheel.path)
    print(f"  sha256 {wheel.sha256}")
    print(f"  {len(wheel.modules)} modules; requires {', '.join(wheel.requires)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
