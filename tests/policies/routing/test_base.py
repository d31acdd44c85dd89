"""policies/routing/base.py: the value types a policy sees and returns."""

from __future__ import annotations

import msgspec
import pytest

from policies.routing.base import BackendState, BackendView, Decision, RequestInfo


def test_the_value_types_are_frozen_structs_with_fresh_default_containers() -> None:
    info = RequestInfo(model="m", prompt="p")
    for value in (info, BackendView(0, "http://e"), Decision(0, "rule")):
        assert isinstance(value, msgspec.Struct)  # built in C: the proxy makes one of each per request
        with pytest.raises(AttributeError):
            setattr(value, value.__struct_fields__[0], None)
    assert RequestInfo().headers == {} and RequestInfo().headers is not RequestInfo().headers
    assert BackendView(0, "u").metrics is not BackendView(0, "u").metrics


def test_a_changed_copy_keeps_every_other_field() -> None:
    view = BackendView(2, "http://e", BackendState.EJECTED, weight=2.0, in_flight=3)
    busy = msgspec.structs.replace(view, num_requests_waiting=5.0)
    assert busy.num_requests_waiting == 5.0 and view.num_requests_waiting is None
    assert (busy.index, busy.url, busy.state, busy.weight, busy.in_flight) == (2, "http://e", BackendState.EJECTED,
                                                                              2.0, 3)
    assert Decision(1, "r") == Decision(1, "r", None) != Decision(1, "r", 4)
