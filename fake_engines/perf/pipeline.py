"""Pipeline parallelism: the bubble, the timeline, and batches in flight (Examples 6 and 7)."""

from __future__ import annotations

from dataclasses import dataclass


def busy_share(micro_batches: int, stages: int) -> float:
    """Share of stage-slots busy when one batch is cut into m micro-batches: m / (m + p - 1)."""
    return micro_batches / (micro_batches + stages - 1)


@dataclass(frozen=True)
class Timeline:
    """Which micro-batch each stage works on in each time slot."""

    stages: int
    """Pipeline stages (GPUs)."""
    micro_batches: int
    """Micro-batches entering one after another."""
    cells: list[list[int | None]]
    """cells[stage][slot]: micro-batch index, or None when the stage is idle."""

    @property
    def slots(self) -> int:
        return self.micro_batches + self.stages - 1

    @property
    def busy(self) -> int:
        return sum(c is not None for row in self.cells for c in row)

    @property
    def busy_share(self) -> float:
        return self.busy / (self.stages * self.slots)


def timeline(stages: int, micro_batches: int) -> Timeline:
    """Micro-batch m reaches stage s in slot m + s."""
    slots = micro_batches + stages - 1
    cells = [[(t - s) if 0 <= t - s < micro_batches else None for t in range(slots)] for s in range(stages)]
    return Timeline(stages=stages, micro_batches=micro_batches, cells=cells)


@dataclass(frozen=True)
class InFlight:
    """Steady decoding with k independent batches in flight on p stages."""

    batches: int
    """Batches in flight (k)."""
    busy_share: float
    """Share of time each GPU is busy: k / p."""
    tokens: int
    """Tokens produced over the window."""
    token_interval_slots: int
    """Slots between two tokens of one sequence (a batch must pass every stage)."""


def batches_in_flight(stages: int, batches: int, seqs_per_batch: int,
                      start_slot: int = 100, window_slots: int = 100) -> InFlight:
    """Count the tokens leaving the last stage: batch b leaves it in slots b + p - 1, b + 2p - 1, ..."""
    tokens = sum(seqs_per_batch for t in range(start_slot, start_slot + window_slots)
                 for b in range(batches) if (t - b - stages + 1) % stages == 0)
    return InFlight(batches=batches, busy_share=batches / stages, tokens=tokens, token_interval_slots=stages)
