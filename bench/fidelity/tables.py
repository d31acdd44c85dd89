"""The capture run's derived tables as fidelity items: each error row and each metric family.

- An error row of `errors_table.md` (case, each engine's status and body) is the request of the
  capture of the same case (`NNN_<case>.http` in that engine's folder): it matches when the
  capture's replay matched and the table's status is the capture's (one source: the capture has
  the full body, the table's is cut short).
- A metric family of the real engine's last `/metrics` capture (`# TYPE` name, type, and the
  label names of its samples; vLLM's `_created` gauges are families of their own, as
  prometheus_client writes them) matches when the look-alike's `/metrics`, scraped after the same
  requests, has a family of that name, type and label names (`le` and `quantile` are the type's
  own and left out).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from pathlib import Path

from bench.fidelity.items import Item

TABLES = Path(__file__).resolve().parents[2] / "tests" / "data" / "real-engines"
TYPE_OWN_LABELS = {"le", "quantile"}
SAMPLE_SUFFIXES = ("_bucket", "_sum", "_count")

def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def error_rows(text: str | None = None) -> list[tuple[str, str, int]]:
    """(engine, case, real status) of every row of errors_table.md, vLLM's then llama-server's."""
    text = text if text is not None else (TABLES / "errors_table.md").read_text()
    rows = []
    for line in text.splitlines():
        cells = _cells(line)
        if len(cells) < 5 or not re.match(r"^\d{3}\b", cells[1]):
            continue
        rows += [("vllm", cells[0], int(cells[1].split()[0])), ("llama.cpp", cells[0], int(cells[3].split()[0]))]
    return sorted(rows, key=lambda r: r[0] != "vllm")


def error_items(rows: Iterable[tuple[str, str, int]], captures: list[Item],
                capture_status: dict[tuple[str, str], int]) -> list[Item]:
    """Each error row's verdict: its capture's, or missing where no capture of the case was replayed."""
    by_case = {(i.engine, re.sub(r"^\d{3}_", "", i.name)): i for i in captures}
    items = []
    for engine, case, status in rows:
        capture = by_case.get((engine, case))
        if capture is None:
            items.append(Item(engine, case, "missing", "no capture of this case is replayed", kind="error"))
        elif capture_status.get((engine, capture.name)) != status:
            items.append(Item(engine, case, "differs", f"table status {status}, capture "
                              f"{capture_status.get((engine, capture.name))}", kind="error"))
        else:
            items.append(Item(engine, case, capture.verdict, capture.detail, kind="error"))
    return items


def exported_families(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """name -> (type, label names over all its samples) of a Prometheus text exposition."""
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)", text, re.MULTILINE))
    labels: dict[str, set[str]] = {name: set() for name in types}
    for sample, label_text in re.findall(r"^([a-zA-Z_:][\w:]*)\{([^}]*)\}", text, re.MULTILINE):
        family = _family_of(sample, types)
        if family is not None:
            labels[family] |= set(re.findall(r'([a-zA-Z_]\w*)="', label_text)) - TYPE_OWN_LABELS
    return {name: (kind, frozenset(labels[name])) for name, kind in types.items()}


def _family_of(sample: str, types: dict[str, str]) -> str | None:
    if sample in types:
        return sample
    for suffix in (*SAMPLE_SUFFIXES, "_total"):
        if sample.endswith(suffix) and sample[: -len(suffix)] in types:
            return sample[: -len(suffix)]
    return None


def metric_items(engine: str, real_text: str, exported_text: str, accepted: dict[tuple[str, str], str],
                 counted: Collection[str] = ()) -> list[Item]:
    """One item per family of the real exposition, against the look-alike's; families in `counted`
    (another run's, already counted) are left out."""
    got = exported_families(exported_text)
    items = []
    for name, (kind, labels) in exported_families(real_text).items():
        if name in counted:
            continue
        if name not in got:
            verdict, detail = "missing", "not exported"
        elif got[name] != (kind, labels):
            verdict, detail = "differs", f"{got[name][0]} {sorted(got[name][1])}, real {kind} {sorted(labels)}"
        else:
            verdict, detail = "matched", ""
        if verdict != "matched" and (engine, name) in accepted:
            verdict, detail = "accepted", accepted[(engine, name)]
        items.append(Item(engine, name, verdict, detail, kind="metric"))
    return items
