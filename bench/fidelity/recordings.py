"""The main capture runs' recordings (the `.txt` files and the transcripts with no request row of
their own), each compared with the same recording made of a look-alike (bench.fidelity.record).

A recording is read in its own text format, and the look-alike's is written in that format, so one
reader and one comparison serve both sides. What is compared, per kind of recording:

- startup (`000*_health_startup_timeline`): the states `/health` went through from process start
  to ready (refused connection, each status with its body), in order: the real sequence must be a
  subsequence of the look-alike's (polled finer), and every look-alike state must be one a real
  start of that engine showed;
- transcript (raw-socket transcripts, partial transcripts of disconnects, and the stream-chunk
  timing's chunks joined): status, header names (not `date`, `content-length` or the look-alike's
  own `x-flotilla-time-scale`), the shape of each SSE event in order (a cut last event left out,
  a run of one shape counted once) and whether the chunked body ended (`0` chunk) or was cut;
- delta (the prefix-cache counter delta, every series changed over a disconnect): each series and
  the direction it moved (up, down, same, new), histogram buckets taken together (`le` dropped);
- snapshot (`/metrics` before, during, after): the real families with their types and label
  names present alike (bench.fidelity.tables), and whether each occupancy gauge is zero;
- timeline (gauge timelines): the series the sampler followed and, for each, where it ended
  against its first value, and a rise or fall above or below it wherever the real sampler caught
  one (a gauge up for a few ms may be caught in one timeline and missed in the other);
- per_request (concurrency per-request records): the record's fields, each request's status,
  whether it was streamed, whether it ended with `[DONE]`, and the JSON keys its tail shows;
- slots (`/slots` during load): status, body shape and the number of busy slots;
- probe (the speed probe's result): the record's fields and a 64-token answer; the ms/token
  figure is the capture machine's CPU, which the look-alike does not model.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.fidelity.replay import CAPTURES, index_rows, shape
from bench.fidelity.tables import exported_families

IGNORED_HEADERS = frozenset({"date", "content-length", "x-flotilla-time-scale"})
"""Header names whose presence is not compared: values of the moment, and the look-alike's own
time-scale header (docs/fidelity.md, Time)."""

OCCUPANCY = ("vllm:num_requests_running", "vllm:num_requests_waiting", "llamacpp:requests_processing",
             "llamacpp:requests_deferred")

_FULL_CONTEXT_ANSWER = (
    "llamacpp:n_tokens_max is history: the real 029 answer (max_tokens omitted) ran to the slot's full "
    "context (1015 tokens, n_tokens_max 1023) on random weights, the look-alike's ends at its modelled end "
    "of sequence, so the 403-token prefix prompts later raise its n_tokens_max, not the real one's")
_CPU_BATCH_COST = (
    "the real CPU engine's token costs about twice as much with both slots busy, a GPU's (the look-alike's "
    "model) about the same, so 1 s into the real run (scaled alike) the real engine was still on its last "
    "request and the look-alike had finished")
_NARROW_MARGIN = (
    "timing with a narrow margin: the real stream of 900 tokens ended 0.42 s after it was sent, just before "
    "the client's 0.5 s, and the real stream requests had ended when the 1 s snapshot came; the look-alike, "
    "scaled alike on a busy machine, falls either side of such a mark from run to run")

ACCEPTED_RECORDINGS: dict[tuple[str, str], str] = {
    ("vllm", "_server_log_vllm_main.txt"):
        "the look-alike logs its own lines (aiohttp's access log, its cold start), not vLLM's banner, engine "
        "configuration, `Application startup complete.` or the periodic `Avg prompt throughput` line; "
        "/metrics carries the same figures",
    ("llama.cpp", "_server_log_llama_main.txt"):
        "the look-alike prints one ready line (`main: server is listening on ...`), not llama-server's "
        "`srv`/`slot` log lines (slot selection, print_timing, release); /slots and /metrics carry the "
        "same facts",
    ("llama.cpp", "040_prefix_cache_counter_delta.txt"): _FULL_CONTEXT_ANSWER,
    ("llama.cpp", "071_disconnect_after_0.5s_all_series_changed.txt"): _FULL_CONTEXT_ANSWER,
    ("llama.cpp", "079_concurrency_nonstream_metrics_snapshot_during_load.txt"): _CPU_BATCH_COST,
    ("llama.cpp", "080_concurrency_nonstream_slots_during_load.http"): _CPU_BATCH_COST,
    ("llama.cpp", "068_disconnect_after_0.5s_partial_transcript.http"): _NARROW_MARGIN,
    ("llama.cpp", "084_concurrency_stream_metrics_snapshot_during_load.txt"): _NARROW_MARGIN,
    ("llama.cpp", "085_concurrency_stream_slots_during_load.http"): _NARROW_MARGIN,
}
"""(engine, recording) -> why the look-alike may differ (docs/fidelity.md lists them): the item is
compared all the same, matched where it matches, else accepted with this reason."""


def recordings(engine: str) -> list[tuple[str, str]]:
    """(file name, kind) of every recording of a main run: its `.txt` files and the `.http` files
    with no request row."""
    folder = CAPTURES / engine
    replayed = {name for name, *_ in index_rows(engine)}
    names = sorted(p.name for p in folder.glob("*.txt")) + sorted(
        p.name for p in folder.glob("*.http") if p.name.removesuffix(".http") not in replayed)
    return [(name, kind_of(name)) for name in names]


def kind_of(name: str) -> str:
    """The kind of a recording, from its file name."""
    for pattern, kind in (("health_startup_timeline", "startup"), ("server_log", "log"),
                          ("chunk_timing", "chunks"), ("transcript", "transcript"), ("counter_delta", "delta"),
                          ("all_series_changed", "delta"), ("speed_probe", "probe"), ("gauge_timeline", "timeline"),
                          ("per_request", "per_request"), ("slots_during_load", "slots"), ("metrics", "snapshot")):
        if pattern in name:
            return kind
    raise ValueError(f"{name}: no comparison for this recording")


def recorded(engine: str, name: str) -> str:
    """The text of a recording (bytes of a transcript read as latin-1, so they come back whole)."""
    return (CAPTURES / engine / name).read_bytes().decode("latin-1")


def compare(kind: str, real: str, ours: str, known_states: Iterable[str] = ()) -> str:
    """'' where the look-alike's recording `ours` matches the real one, else what differs."""
    if kind == "startup":
        return _compare_startup(real, ours, set(known_states))
    if kind == "chunks":
        return _differ(transcript_signature(chunks_joined(real)), transcript_signature(chunks_joined(ours)))
    if kind == "snapshot":
        return compare_snapshot(real, ours)
    if kind == "timeline":
        return compare_timeline(real, ours)
    compared = {"transcript": transcript_signature, "delta": delta_signature, "slots": slots_signature, "probe": probe_signature}
    if kind in compared:
        return _differ(compared[kind](real), compared[kind](ours))
    if kind == "per_request":
        return _compare_per_request(real, ours)
    raise ValueError(f"no comparison for {kind}")


def _differ(real: Any, ours: Any) -> str:
    if real == ours:
        return ""
    if isinstance(real, dict) and isinstance(ours, dict):
        keys = sorted({k for k in real.keys() | ours.keys() if real.get(k) != ours.get(k)}, key=str)
        return "; ".join(f"{k}: {ours.get(k)!r}, real {real.get(k)!r}" for k in keys[:4])[:300]
    return f"{ours!r}, real {real!r}"[:300]


# startup -----------------------------------------------------------------------------------------

def startup_states(text: str) -> list[str]:
    """The states of a startup timeline in order: 'refused' or 'STATUS BODY' (JSON bodies sorted)."""
    states = []
    for line in text.splitlines():
        if not line.startswith("t="):
            continue
        if "ECONNREFUSED" in line:
            states.append("refused")
            continue
        match = re.search(r"HTTP (\d+) body=((?:'|\").*?(?:'|\")) headers=", line)
        if match is None:
            raise ValueError(f"unreadable startup line: {line[:80]}")
        body = ast.literal_eval(match.group(2))
        try:
            body = json.dumps(json.loads(body), sort_keys=True) if body else ""
        except json.JSONDecodeError:
            pass
        states.append(f"{match.group(1)} {body}".strip())
    return states


def startup_line(t: float, status: int | None, body: str = "", headers: str = "") -> str:
    """One line of a startup timeline, as the capture wrote it."""
    if status is None:
        return f"t={t:8.3f}s  ECONNREFUSED (TCP port closed)"
    return f"t={t:8.3f}s  HTTP {status} body={body!r} headers=[{headers}]"


def _compare_startup(real: str, ours: str, known: set[str]) -> str:
    want, got = startup_states(real), startup_states(ours)
    it = iter(got)
    if not all(state in it for state in want):  # a subsequence: the real poll was coarser
        return f"states {got}, real {want}"
    unknown = [s for s in got if known and s not in known]
    return f"states {unknown} no real start showed" if unknown else ""


# transcripts -------------------------------------------------------------------------------------

def chunks_joined(text: str) -> str:
    """The bytes of a chunk-timing recording (`T NB b'...'` per chunk) joined, as latin-1 text."""
    out = b""
    for line in text.splitlines():
        match = re.match(r"^\S+s \d+B (b(?:'|\").*(?:'|\"))$", line)
        if match:
            out += ast.literal_eval(match.group(1))
    return out.decode("latin-1")


def chunks_line(t: float, chunk: bytes) -> str:
    """One line of a chunk-timing recording, as the capture wrote it."""
    return f"{t:.4f}s {len(chunk)}B {chunk!r}"


def transcript_signature(raw: str) -> dict[str, Any]:
    """Status, header names, the SSE events' shapes in order and how the body ended."""
    head, _, body = raw.partition("\r\n\r\n") if "\r\n\r\n" in raw else raw.partition("\n\n")
    lines = head.splitlines()
    headers = frozenset(line.split(":", 1)[0].strip().lower() for line in lines[1:] if ":" in line)
    data, ended = _dechunk(body) if "transfer-encoding" in headers else (body, True)
    shapes = []
    for event in re.findall(r"^data: (.*)$", data, re.MULTILINE):
        if event.strip() == "[DONE]":
            kind: Any = ("done",)
        else:
            try:
                kind = shape(json.loads(event.encode("latin-1").decode("utf-8", errors="replace")))
            except json.JSONDecodeError:  # the event the client's leaving cut short
                continue
        if not shapes or shapes[-1] != kind:
            shapes.append(kind)
    return {"status": lines[0].split()[1] if lines else "", "headers": headers - IGNORED_HEADERS,
            "events": tuple(shapes), "ended": ended}


def _dechunk(body: str) -> tuple[str, bool]:
    """The data of a chunked body, and whether its last (0-size) chunk came."""
    out, rest = [], body
    while rest:
        size_line, sep, rest = rest.partition("\r\n")
        try:
            size = int(size_line.split(";")[0], 16)
        except ValueError:
            return "".join(out), False
        if size == 0:
            return "".join(out), bool(sep)
        out.append(rest[:size])
        rest = rest[size + 2:]
    return "".join(out), False


# counters ----------------------------------------------------------------------------------------

def series_changed(before: str, after: str, names: Iterable[str] | None = None) -> str:
    """`series: before -> after` for each series whose value changed (every series of `names` if
    given, changed or not), as the capture run's diff wrote it (process_, python_gc and http_
    series left out)."""
    def parse(text: str) -> dict[str, str]:
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = value
        return out
    a, b = parse(before), parse(after)
    keys = sorted(set(a) | set(b))
    if names is not None:
        wanted = set(names)
        return "".join(f"{k}: {_num(a.get(k))} -> {_num(b.get(k))}\n" for k in keys if re.split(r"[{ ]", k)[0] in wanted)
    return "".join(f"{k}: {a.get(k)} -> {b.get(k)}\n" for k in keys
                   if a.get(k) != b.get(k) and not k.startswith(("process_", "python_gc", "http_")))


def _num(value: str | None) -> str | None:
    return None if value is None else repr(float(value)) if "." in value or "e" in value else value


def delta_signature(text: str) -> dict[str, frozenset[str]]:
    """series (buckets together) -> the directions its values moved."""
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        match = re.match(r"^(.*): (\S+) -> (\S+)$", line)
        if not match:
            continue
        key = re.sub(r',?le="[^"]*"', "", match.group(1)).replace("{,", "{").replace("{}", "")
        out.setdefault(key, set()).add(_direction(match.group(2), match.group(3)))
    return {k: frozenset(v) for k, v in out.items()}


def _direction(before: str, after: str) -> str:
    if before == "None":
        return "new"
    if after == "None":
        return "gone"
    a, b = float(before), float(after)
    return "up" if b > a else "down" if b < a else "same"


def snapshot_signature(text: str) -> dict[str, Any]:
    """The families (type, label names) and whether each occupancy gauge is above zero."""
    occupancy = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in OCCUPANCY:
                occupancy[sample.name] = occupancy.get(sample.name, False) or sample.value > 0
    return {"families": exported_families(text), "busy": occupancy}


def compare_snapshot(real: str, ours: str) -> str:
    """The real families present alike in ours (ours may have more), occupancy alike."""
    want, got = snapshot_signature(real), snapshot_signature(ours)
    wrong = sorted(n for n, f in want["families"].items() if got["families"].get(n) != f)
    if wrong:
        return f"families missing or unlike: {wrong[:5]}"
    return _differ(want["busy"], got["busy"])


# timelines and per-request records ---------------------------------------------------------------

def timeline_samples(text: str) -> list[dict[str, float | str]]:
    """Each sample line of a gauge timeline as series -> value (`slots` -> the busy/idle list)."""
    out = []
    for line in text.splitlines():
        if not line.startswith("t=") or "(reply at" not in line:
            continue
        tokens = line.split(")", 1)[1].split()
        sample: dict[str, float | str] = {}
        i = 0
        while i < len(tokens):
            if tokens[i].startswith("slots="):
                sample["slots"] = str(tokens[i].count("busy"))
                i += 1
            else:
                sample[tokens[i]] = float(tokens[i + 1])
                i += 2
        out.append(sample)
    return out


def timeline_line(t: float, reply: float, values: dict[str, str], slots: str | None = None) -> str:
    """One sample line of a gauge timeline, as the capture's sampler wrote it."""
    pairs = " ".join(f"{k} {v}" for k, v in values.items())
    return f"t={t:7.3f}s (reply at {reply:7.3f}s) {pairs} " + (f"slots={slots}" if slots is not None else "")


def timeline_signature(text: str) -> dict[str, tuple[bool, bool, str]]:
    """series -> (rose above its first value, fell below it, where it ended against it)."""
    samples = timeline_samples(text)
    out = {}
    for key in {k for s in samples for k in s}:
        values = [float(s[key]) for s in samples if key in s]
        first, last = values[0], values[-1]
        out[key] = (max(values) > first, min(values) < first, "up" if last > first else "down" if last < first else "same")
    return out


def compare_timeline(real: str, ours: str) -> str:
    """The same series; each ends where the real one ended against its first value, and rose or
    fell where the real one was caught rising or falling (a sample every 100 ms proves a movement
    it catches, not the absence of one it misses: a gauge up for a few ms may show in one and not
    the other)."""
    want, got = timeline_signature(real), timeline_signature(ours)
    if set(want) != set(got):
        return f"series {sorted(set(got) ^ set(want))[:4]} in one only"
    wrong = {k: (got[k], want[k]) for k in want
             if got[k][2] != want[k][2] or (want[k][0] and not got[k][0]) or (want[k][1] and not got[k][1])}
    return "; ".join(f"{k}: {g}, real {w}" for k, (g, w) in list(wrong.items())[:4])


def per_request_records(text: str) -> list[dict[str, Any]]:
    """Each request of a per-request record: its fields, status, streamed, [DONE], tail keys."""
    out = []
    for line in text.splitlines():
        match = re.match(r"^req \d+: (.*?) tail=(b(?:'|\").*(?:'|\"))$", line)
        if not match:
            continue
        fields = dict(f.split("=", 1) for f in match.group(1).split())
        tail = ast.literal_eval(match.group(2)).decode("utf-8", errors="replace")
        out.append({"fields": tuple(fields) + ("tail",), "status": fields["status"],
                    "streamed": int(fields["sse_data_events"]) > 0, "done": tail.rstrip().endswith("[DONE]"),
                    "keys": frozenset(re.findall(r'"(\w+)":', tail))})
    return out


def per_request_line(i: int, sent_at: float, status: int, first_byte: float, total: float, body: bytes,
                     tail: int = 1200) -> str:
    """One request of a per-request record, as the capture wrote it (a longer tail, so the keys the
    real tail shows are in it whatever the values' lengths)."""
    return (f"req {i}: sent_at={sent_at:.3f}s status={status} curl_time_starttransfer={first_byte:.3f}s "
            f"curl_time_total={total:.3f}s sse_data_events={body.count(b'data:')} tail={body[-tail:]!r}")


def _compare_per_request(real: str, ours: str) -> str:
    want, got = per_request_records(real), per_request_records(ours)
    if len(want) != len(got):
        return f"{len(got)} requests, real {len(want)}"
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        plain = {k: w[k] for k in ("fields", "status", "streamed", "done")}
        if plain != {k: g[k] for k in plain}:
            return f"req {i}: " + _differ(plain, {k: g[k] for k in plain})
        if not w["keys"] <= g["keys"]:
            return f"req {i}: keys {sorted(w['keys'] - g['keys'])} missing"
    return ""


def slots_signature(text: str) -> dict[str, Any]:
    """Status, body shape and busy slots of a `/slots` transcript."""
    head, _, body = re.split(r"(\r?\n\r?\n)", text, maxsplit=1)
    slots = json.loads(body)
    return {"status": head.split()[1], "shape": shape(slots), "busy": sum(bool(s.get("is_processing")) for s in slots)}


def probe_signature(text: str) -> dict[str, Any]:
    """The speed probe's record: its fields (the figure itself is the capture machine's CPU)."""
    match = re.match(r"^~[\d.]+ ms/token single stream; long requests use max_tokens=\d+$", text.strip())
    return {"record": bool(match), "text": None if match else text.strip()[:120]}
