from __future__ import annotations

from flotilla.kv_events import BlockStored, KVEventBatch
from policies.routing.kv_feed import EventFeed
from policies.routing.kv_index import KVIndex

BS = 2


def store(seq: int) -> KVEventBatch:
    """Batch number `seq` stores block `seq` (engine hash 1000 + seq, tokens [seq, seq]) as a
    first block, so every batch is independent of the others."""
    event = BlockStored(block_hashes=[1000 + seq], parent_block_hash=None, token_ids=[seq, seq], block_size=BS,
                        lora_id=None, medium="GPU", lora_name=None)
    return KVEventBatch(ts=float(seq), events=[event])


def held(index: KVIndex) -> set[int]:
    return {h - 1000 for h in index.engine_hashes("a")}


def test_in_order_batches_are_applied_as_they_come():
    index = KVIndex()
    feed = EventFeed(index, "a")
    for seq in range(3):
        assert feed.live(seq, store(seq)) is None
    assert held(index) == {0, 1, 2} and feed.next_seq == 3


def test_connecting_replays_from_zero_and_holds_live_batches_until_the_replay_ends():
    index = KVIndex()
    feed = EventFeed(index, "a")
    assert feed.connected() == 0
    assert feed.live(3, store(3)) is None  # held
    assert held(index) == set()
    for seq in range(4):
        feed.replayed(seq, store(seq))
    feed.replay_done()
    assert held(index) == {0, 1, 2, 3} and feed.stats.duplicates == 1 and feed.next_seq == 4


def test_a_gap_asks_for_a_replay_from_the_first_missing_batch():
    index = KVIndex()
    feed = EventFeed(index, "a")
    feed.live(0, store(0))
    assert feed.live(3, store(3)) == 1
    assert feed.stats.gaps == 1 and held(index) == {0}
    for seq in (1, 2, 3):
        feed.replayed(seq, store(seq))
    feed.replay_done()
    assert held(index) == {0, 1, 2, 3} and feed.stats.resyncs == 0


def test_a_replay_that_cannot_fill_the_gap_clears_and_resyncs():
    index = KVIndex()
    feed = EventFeed(index, "a")
    feed.live(0, store(0))
    assert feed.live(5, store(5)) == 1
    for seq in (4, 5):  # the publisher's buffer starts at 4: 1 to 3 are gone
        feed.replayed(seq, store(seq))
    feed.replay_done()
    assert held(index) == {4, 5}
    assert feed.stats.resyncs == 1 and feed.next_seq == 6


def test_without_a_replay_socket_a_gap_clears_and_resyncs_at_once():
    index = KVIndex()
    feed = EventFeed(index, "a", can_replay=False)
    assert feed.connected() is None
    feed.live(7, store(7))  # joined late: nothing to ask for, start here
    assert feed.live(9, store(9)) is None
    assert held(index) == {9} and feed.stats.resyncs == 1


def test_a_failed_replay_resyncs_from_the_held_batches():
    index = KVIndex()
    feed = EventFeed(index, "a")
    feed.live(0, store(0))
    feed.live(2, store(2))
    feed.live(3, store(3))  # held while the replay is pending
    feed.replay_failed()
    assert held(index) == {2, 3} and feed.next_seq == 4


def test_a_live_batch_the_replay_already_delivered_is_a_duplicate():
    index = KVIndex()
    feed = EventFeed(index, "a")
    feed.connected()
    for seq in range(3):
        feed.replayed(seq, store(seq))
    feed.replay_done()
    assert feed.live(2, store(2)) is None  # the live stream lagged behind the replay answer
    assert held(index) == {0, 1, 2} and feed.stats.duplicates == 1 and feed.stats.restarts == 0


def test_without_replay_numbers_going_back_mean_the_publisher_restarted_with_an_empty_cache():
    index = KVIndex()
    feed = EventFeed(index, "a", can_replay=False)
    for seq in range(3):
        feed.live(seq, store(seq))
    feed.live(0, store(10))
    assert held(index) == {10} and feed.stats.restarts == 1


def test_a_disconnect_clears_and_the_reconnect_replays_from_zero():
    index = KVIndex()
    feed = EventFeed(index, "a")
    feed.live(0, store(0))
    feed.disconnected()
    assert held(index) == set() and index.tracks("a")
    assert feed.connected() == 0
    feed.replayed(0, store(0))
    feed.replay_done()
    assert held(index) == {0}
