"""Stop strings, applied to streamed text the way both engines do: cut before the first match."""

from __future__ import annotations


def cut_at_stop(sent: str, new: str, stops: list[str]) -> tuple[str, str | None]:
    """The part of `new` to send and the stop string that ends the text, if one now appears."""
    text = sent + new
    hits = [(text.find(stop, max(len(sent) - len(stop) + 1, 0)), stop) for stop in stops if stop]
    hits = [(pos, stop) for pos, stop in hits if pos >= 0]
    if not hits:
        return new, None
    pos, stop = min(hits)
    return text[len(sent):max(pos, len(sent))], stop
