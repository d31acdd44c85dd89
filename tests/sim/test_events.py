from sim.events import Event, EventQueue, Phase


def test_completion_runs_before_arrival_at_the_same_instant_then_creation_order() -> None:
    q = EventQueue()
    seen: list[str] = []
    q.push(Event(1.0, Phase.ARRIVAL, lambda t: seen.append("arrival-a")))
    q.push(Event(1.0, Phase.SCALE, lambda t: seen.append("scale")))
    q.push(Event(1.0, Phase.COMPLETION, lambda t: seen.append("completion")))
    q.push(Event(1.0, Phase.ARRIVAL, lambda t: seen.append("arrival-b")))
    q.push(Event(0.5, Phase.SCRAPE, lambda t: seen.append("early-scrape")))
    q.run()
    assert seen == ["early-scrape", "completion", "arrival-a", "arrival-b", "scale"]


def test_handlers_return_follow_up_events_and_the_clock_advances() -> None:
    q = EventQueue()
    times: list[float] = []

    def tick(t: float) -> list[Event]:
        times.append(t)
        return [Event(t + 0.25, Phase.SCRAPE, tick)] if t < 1.0 else []

    q.push(Event(0.0, Phase.SCRAPE, tick))
    q.run()
    assert times == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert q.now_s == 1.0 and q.events_run == 5


def test_run_until_leaves_later_events_queued() -> None:
    q = EventQueue()
    q.push(Event(5.0, Phase.ARRIVAL, lambda t: None))
    q.run(until_s=4.0)
    assert len(q) == 1 and q.now_s == 0.0


def test_an_event_in_the_past_is_refused() -> None:
    q = EventQueue()
    q.push(Event(2.0, Phase.ARRIVAL, lambda t: [Event(1.0, Phase.ARRIVAL, lambda t: None)]))
    try:
        q.run()
    except ValueError as exc:
        assert "in the past" in str(exc)
    else:
        raise AssertionError("expected ValueError")
