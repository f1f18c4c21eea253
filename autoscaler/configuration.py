"""Cluster configurations: which instances exist (or should) and which tasks each hosts."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain

from autoscaler.catalog import InstanceType


@dataclass(frozen=True, slots=True)
class Instance:
    """An instance and the tasks assigned to it.

    `instance_id` is ours (the launch token the state recorded) for an instance
    that exists or was requested; None for an instance a plan wants launched.
    """

    instance_id: str | None
    type: InstanceType
    tasks: tuple[str, ...]

    @property
    def hourly_cost(self) -> float:
        return self.type.hourly_cost


@dataclass(frozen=True, slots=True)
class Configuration:
    """A set of instances with their tasks; each task on at most one instance."""

    instances: tuple[Instance, ...] = ()

    def __post_init__(self) -> None:
        total = sum(len(inst.tasks) for inst in self.instances)
        if len(set(chain.from_iterable(inst.tasks for inst in self.instances))) != total:
            seen: set[str] = set()
            for task in chain.from_iterable(inst.tasks for inst in self.instances):
                if task in seen:
                    raise ValueError(f"task {task!r} is assigned to two instances")
                seen.add(task)

    def __iter__(self) -> Iterator[Instance]:
        return iter(self.instances)

    def __len__(self) -> int:
        return len(self.instances)

    @property
    def hourly_cost(self) -> float:
        return sum(inst.type.hourly_cost for inst in self.instances)

    def assignment(self) -> dict[str, Instance]:
        """Task id -> the instance hosting it."""
        return {task: inst for inst in self.instances for task in inst.tasks}

    def task_ids(self) -> set[str]:
        return {task for inst in self.instances for task in inst.tasks}

    def by_id(self) -> dict[str, Instance]:
        return {i.instance_id: i for i in self.instances if i.instance_id is not None}

    @classmethod
    def of(cls, instances: Iterable[Instance]) -> Configuration:
        return cls(tuple(instances))
