"""policies/frozen.py: a quick __init__ that builds the same frozen dataclass."""

from __future__ import annotations

import dataclasses
from dataclasses import InitVar, dataclass, field

import msgspec
import pytest

from policies.frozen import quick_init
from policies.routing.base import BackendView, Decision, RequestInfo
from proxy.dispatch import Forward
from proxy.request_parse import ParsedRequest
from proxy.usage import Usage


def _sample(fast: bool) -> type:
    @dataclass(frozen=True)
    class Sample:
        a: int
        b: str = "b"
        c: list = field(default_factory=list)
        d: int = field(default=4, kw_only=True)

        def __post_init__(self) -> None:
            if self.a < 0:
                raise ValueError("a must not be negative")

    return quick_init(Sample) if fast else Sample


CALLS = [((1,), {}), ((1, "x"), {}), ((1,), {"c": [2], "d": 5}), ((), {"a": 3, "b": "y"})]


@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_the_quick_init_builds_what_the_dataclass_init_builds(args: tuple, kwargs: dict) -> None:
    quick, plain = _sample(True), _sample(False)
    got, want = quick(*args, **kwargs), plain(*args, **kwargs)
    assert dataclasses.asdict(got) == dataclasses.asdict(want)
    assert repr(got).split("(", 1)[1] == repr(want).split("(", 1)[1]
    assert got == quick(*args, **kwargs) and got != quick(*args, **{**kwargs, "d": 99})


def test_what_the_quick_init_builds_is_still_frozen_and_checked() -> None:
    quick = _sample(True)
    one = quick(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        one.a = 2
    assert quick(1).c is not one.c  # a fresh factory value per instance
    assert dataclasses.replace(one, b="z") == quick(1, "z")
    with pytest.raises(ValueError, match="negative"):  # __post_init__ still runs
        quick(-1)
    with pytest.raises(TypeError):
        quick()
    with pytest.raises(TypeError):
        quick(1, "x", [], 5)  # d is keyword-only, as in the dataclass's own __init__


def test_classes_it_cannot_build_the_same_way_are_refused() -> None:
    @dataclass
    class Mutable:
        a: int

    @dataclass(frozen=True, slots=True)
    class Slotted:
        a: int

    @dataclass(frozen=True)
    class WithInitVar:
        a: int
        scale: InitVar[int] = 1

    @dataclass(frozen=True)
    class Derived:
        a: int
        b: int = field(default=0, init=False)

    for cls in (Mutable, Slotted, WithInitVar, Derived):
        with pytest.raises(TypeError):
            quick_init(cls)


def test_the_request_paths_value_types_are_built_quickly_and_stay_frozen() -> None:
    info = RequestInfo(model="m", prompt="p")
    for value in (info, BackendView(0, "http://e"), Decision(0, "rule")):  # the policies' types
        # dataclasses' own frozen __init__ stores each field through object.__setattr__
        names = type(value).__init__.__code__.co_names
        assert "__setattr__" not in names and "__dict__" in names
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.__setattr__(dataclasses.fields(value)[0].name, None)
    # the proxy's own are msgspec Structs, built in C
    for struct in (ParsedRequest(info, False), Forward("POST", "/v1/completions", b"{}", info), Usage(3, 1)):
        assert isinstance(struct, msgspec.Struct)
        with pytest.raises(AttributeError):
            setattr(struct, struct.__struct_fields__[0], None)
    assert RequestInfo().headers == {} and RequestInfo().headers is not RequestInfo().headers
