"""Reservation prices and TNRP, on the paper's examples (Eva §4.2–4.4)."""

import pytest

from autoscaler.pricing import PriceBook, reservation_price, tnrp
from tests.builders import job, table3_catalog, table3_jobs


def test_reservation_prices_of_table3_tasks():
    catalog = table3_catalog()
    prices = [reservation_price(j.tasks[0], catalog) for j in table3_jobs()]
    assert prices == [12.0, 3.0, 0.8, 0.4]


def test_no_packing_cost_of_table3_is_16_2():
    book = PriceBook(table3_catalog())
    assert book.no_packing_hourly_cost(table3_jobs()) == pytest.approx(16.2)


def test_tnrp_of_colocated_pair_from_section_4_3():
    # τ1 ($12) and τ2 ($3) at throughputs 0.8 and 0.9: $12.3 ≥ $12 -> cost-efficient.
    assert tnrp(12.0, 0.8) + tnrp(3.0, 0.9) == pytest.approx(12.3)
    # At 0.7 and 0.8: $10.8 < $12 -> not.
    assert tnrp(12.0, 0.7) + tnrp(3.0, 0.8) == pytest.approx(10.8)


def test_multi_task_tnrp_charges_the_whole_jobs_value():
    # Job j: four tasks with RP $3 each, RP(j) = $12. One task at throughput 0.9
    # costs the job 10% of $12: TNRP = 3 − 0.1 × 12 = $1.8, not 0.9 × 3 = $2.7.
    assert tnrp(3.0, 0.9, job_rp=12.0) == pytest.approx(1.8)
    # A single-task job is the special case RP(j) = RP(τ).
    assert tnrp(3.0, 0.9, job_rp=3.0) == pytest.approx(tnrp(3.0, 0.9))
    # Severe interference makes a task worth less than nothing: at 0.5 it costs
    # the job half of $12, twice what the task is worth alone (§4.4's plain form).
    assert tnrp(3.0, 0.5, job_rp=12.0) == pytest.approx(-3.0)


def test_job_rp_sums_its_tasks():
    multi = job("j", (1, 4, 10), (0, 6, 20))
    book = PriceBook(table3_catalog())
    assert book.job_rp(multi) == pytest.approx(3.8)
    assert [book.cheapest_type(t).name for t in multi.tasks] == ["it2", "it3"]
