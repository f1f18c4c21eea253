"""A round's writes are a few statements however many rows they hold, and write what the
in-memory store holds after the same calls: on PostgreSQL they are one `INSERT … SELECT`
or `UPDATE … FROM` per table (from arrays up to `FEW` rows, from JSON arrays beyond), on
SQLite one `executemany`."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import event

from autoscaler.store import (
    ActionRecord,
    InstanceChange,
    RefreshedPrices,
    RoundIntents,
    RoundRecord,
    Store,
    TaskUpdate,
)
from state.memory import InMemoryStore
from state.store import FEW, SqlStore
from tests.builders import job
from tests.state.checks import assert_consistent, state_of


@contextmanager
def counted(store: SqlStore) -> Iterator[list[tuple[str, bool]]]:
    """The statements the store sends while the block runs, each with whether it went
    as an executemany (one call, but on PostgreSQL one statement per row on the wire)."""
    sent: list[tuple[str, bool]] = []

    def note(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        sent.append((statement, executemany))

    event.listen(store.engine, "before_cursor_execute", note)
    try:
        yield sent
    finally:
        event.remove(store.engine, "before_cursor_execute", note)


def submitted(store: Store, prefix: str, n: int, at: float) -> None:
    for k in range(n):
        store.submit_job(job(f"{prefix}{k}", (0, 2, 4)), owner="ana", at=at)


def a_busy_round(store: Store, prefix: str, n: int, at: float) -> None:
    """What a round over `n` new one-task jobs (`submitted`) writes, as the control loop
    writes it: the launches and their placements recorded, the cloud's answers (two for
    some instances in one batch, some without a zone), the actions' outcomes, then some
    placements starting and some instances ending and billed no more."""
    ids = [f"{prefix}-i{k}" for k in range(n)]
    record = RoundRecord(
        at,
        "eva",
        "full",
        True,
        "launch",
        actions=tuple(
            ActionRecord("launch", i, f"launch {i}", detail={"n": k}) for k, i in enumerate(ids)
        ),
    )
    intents = RoundIntents(
        tuple((i, "p3.2xlarge", 3 if k % 2 else 3.06) for k, i in enumerate(ids)),
        {f"{prefix}{k}/0": i for k, i in enumerate(ids)},
    )
    round_id = store.record_round(record, intents)
    answers = [
        InstanceChange(i, "pending", f"cloud-{i}", None if k % 2 else "z1", "launched", None)
        for k, i in enumerate(ids)
    ]
    # Instances the cloud answers running at once: a second change in the same batch.
    answers += [InstanceChange(i, "running", reason="running") for i in ids[::3]]
    store.transition_instances(answers, at + 1)
    store.record_action_outcomes(
        round_id, [(k, "done", f"cloud-{i}") for k, i in enumerate(ids) if k % 4]
    )
    store.transition_instances([InstanceChange(i, "running", reason="listed") for i in ids], at + 2)
    store.update_tasks(
        [
            TaskUpdate(f"{prefix}{k}/0", status="starting", instance_id=i)
            for k, i in enumerate(ids)
            if k % 2 == 0
        ],
        at + 3,
    )
    store.transition_instances(
        [InstanceChange(i, "terminating", reason="not needed") for i in ids[1::2]], at + 4
    )
    # Their billing ends (the ledger's open intervals closed in bulk), some twice over.
    gone = [InstanceChange(i, "terminated", reason="gone") for i in ids[1::2]]
    store.transition_instances(gone + gone[:2], at + 5)


def test_a_round_writes_as_many_statements_for_many_rows_as_for_few(sql_store: SqlStore) -> None:
    submitted(sql_store, "a", 4, 0.0)
    submitted(sql_store, "b", 120, 0.0)
    with counted(sql_store) as few:
        a_busy_round(sql_store, "a", 4, 0.0)
    with counted(sql_store) as many:
        a_busy_round(sql_store, "b", 120, 100.0)
    assert len(many) == len(few)
    if sql_store.engine.dialect.name == "postgresql":
        assert [s for s, executemany in many if executemany] == []
    assert_consistent(sql_store)


def test_bulk_writes_hold_what_the_in_memory_store_holds(sql_store: SqlStore) -> None:
    memory = InMemoryStore()
    many = FEW + 30  # beyond FEW: PostgreSQL's writes and id lists go as JSON arrays
    for store in (sql_store, memory):
        submitted(store, "a", 30, 0.0)
        submitted(store, "b", 7, 0.0)
        submitted(store, "c", many, 0.0)
        a_busy_round(store, "a", 30, 0.0)
        a_busy_round(store, "b", 7, 50.0)
        a_busy_round(store, "c", many, 70.0)
    assert state_of(sql_store) == state_of(memory)
    # And in the order of the requests (the ids a sequence gave them follow it).
    assert [i.instance_id for i in sql_store.instances(include_finished=True)] == [
        i.instance_id for i in memory.instances(include_finished=True)
    ]


def test_many_rows_read_back_exactly_whatever_their_values(sql_store: SqlStore) -> None:
    """Beyond `FEW` rows (JSON arrays on PostgreSQL) as below: floats bit for bit, the
    infinite ones included (JSON cannot hold them; SQLite stores NaN as NULL, so it is left
    out), and text with quotes, backslashes, non-ASCII characters and words JSON reserves."""
    names = ['q"uote', "back\\slash", "é€😀", "NaN", "Infinity", "null", "[1]"]
    floats = [0.1 + 0.2, 1e-320, 5e300, -2.5, math.inf, -math.inf, 7.0]
    for count in (FEW - 10, FEW + 10):
        prices = {
            f"{names[k % len(names)]}-{k}": {"z1": floats[k % len(floats)], "z2": k / 3}
            for k in range(count // 2)
        }
        at = float(count)
        assert sql_store.record_spot_prices(RefreshedPrices("r", prices, at, "test"))
        back = sql_store.spot_prices("r")
        assert back is not None and back.retrieved_at == at
        assert sorted(back.prices) == sorted(prices)
        for itype, by_zone in prices.items():
            for zone, price in by_zone.items():
                got = back.prices[itype][zone]
                assert got == price, (itype, zone)
