"""Setting a store's state up the way production writes it, for tests.

The `Store` protocol holds only what production calls: an instance is recorded
by the round that requests it and a plan's targets by the round that adopts
them (`Store.record_round` with its intents); tasks change by `update_tasks`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from autoscaler.store import InstanceStatus, RoundIntents, RoundRecord, Store


def adopted_round(
    store: Store,
    at: float,
    *,
    requests: Iterable[tuple[str, str, float]] = (),
    targets: Mapping[str, str | None] | None = None,
    drains: Iterable[tuple[str, str]] = (),
    terminations: Iterable[tuple[str, InstanceStatus, str]] = (),
    had_event: bool = False,
) -> int:
    """Record a round, as an earlier process would have, with these intents; its id."""
    record = RoundRecord(at, "test", "none", had_event, "set up by the test")
    intents = RoundIntents(tuple(requests), dict(targets or {}), tuple(drains), tuple(terminations))
    return store.record_round(record, intents)


def request(store: Store, instance_id: str, instance_type: str, price: float, at: float) -> None:
    """Record one instance request (by the round that asks for it)."""
    adopted_round(store, at, requests=[(instance_id, instance_type, price)])
