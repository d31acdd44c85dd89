"""Worked comparison: cold-start-aware scaling against the seed rule with a long cold start.

The seed lesson's Example 18: traffic ramps from 2 to 8 requests/s between 120 s and 240 s, one
replica serves 2/s, and the scaler looks every 30 s. The seed rule asks for
ceil((rate + waiting / 60) / 1.6) replicas and ignores the ones already starting, so with a
190 s cold start the queue keeps adding replicas that are already on their way: 831 requests
wait at the peak and the fleet overshoots to 14 replicas where 5 carry the load. Counting
starting replicas as capacity in progress (the cold-start-aware policy) cannot make the cold
start shorter, so the queue peaks just as high, but it stops the overshoot.
"""

from flotilla.testing import EXAMPLE_18_RATE, compare_scaling


def test_cold_start_aware_scaling_stops_the_seed_rules_overshoot_without_a_longer_queue():
    table = compare_scaling(["seed", "cold-start-aware"], EXAMPLE_18_RATE, capacity_rps=2.0,
                            cold_start_s=190, duration_s=600)
    print(table.table())
    seed, aware = table["seed"], table["cold-start-aware"]
    # the seed's printed figures: peak 831 waiting, 208 s of queueing, 14 replicas
    assert (round(seed["peak_waiting"]), round(seed["peak_queueing_delay_s"]), seed["peak_replicas"]) == (831, 208, 14)
    assert aware["peak_replicas"] <= 10 < seed["peak_replicas"]
    assert aware["scale_ups"] < seed["scale_ups"]
    assert aware["peak_waiting"] <= seed["peak_waiting"]
    assert table.best("peak_replicas") == "cold-start-aware"


def test_with_a_70_s_cold_start_both_rules_hold_the_queue_to_the_seeds_254():
    table = compare_scaling(["seed", "cold-start-aware"], EXAMPLE_18_RATE, cold_start_s=70)
    assert [round(v) for v in table.metric("peak_waiting").values()] == [254, 254]
    assert table["seed"]["peak_replicas"] == 8
    assert table["cold-start-aware"]["peak_replicas"] < 8
