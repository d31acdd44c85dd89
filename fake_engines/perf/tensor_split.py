"""Tensor-parallel splits of a linear layer and of an MLP, checked against one device (Examples 2, 3).

Integer-valued matrices keep the comparison exact: equal means bit-for-bit equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ColumnSplit:
    """y = x W with W's output columns shared out over devices."""

    full: np.ndarray
    """One device's result (tokens x outputs)."""
    parts: list[np.ndarray]
    """Each device's output columns."""
    gathered: np.ndarray
    """The parts concatenated along the columns (the all-gather)."""
    weights_per_device: int
    """Weights each device stores."""
    weights_total: int
    """Weights of the unsplit matrix."""

    @property
    def equal(self) -> bool:
        return bool(np.array_equal(self.full, self.gathered))


@dataclass(frozen=True)
class MlpSplit:
    """y = relu(x A) B with A split by columns and B by rows (Megatron-LM)."""

    partials: list[np.ndarray]
    """Each device's full-size partial output."""
    reduced: np.ndarray
    """Sum of the partials (the all-reduce)."""
    reference: np.ndarray
    """One device's result."""
    wrong: np.ndarray
    """A split by rows instead, ReLU applied to partial sums: not the reference."""

    @property
    def equal(self) -> bool:
        return bool(np.array_equal(self.reduced, self.reference))

    @property
    def wrong_equal(self) -> bool:
        return bool(np.array_equal(self.wrong, self.reference))


def relu(m: np.ndarray) -> np.ndarray:
    return np.maximum(m, 0)


def column_split(x: np.ndarray, w: np.ndarray, devices: int) -> ColumnSplit:
    """Each device multiplies x by its block of W's columns."""
    blocks = np.split(w, devices, axis=1)
    parts = [x @ b for b in blocks]
    return ColumnSplit(full=x @ w, parts=parts, gathered=np.concatenate(parts, axis=1),
                       weights_per_device=blocks[0].size, weights_total=w.size)


def mlp_split(x: np.ndarray, a: np.ndarray, b: np.ndarray, devices: int) -> MlpSplit:
    """Columns of A and the matching rows of B per device; ReLU stays local; one all-reduce."""
    a_cols, b_rows = np.split(a, devices, axis=1), np.split(b, devices, axis=0)
    partials = [relu(x @ ac) @ br for ac, br in zip(a_cols, b_rows, strict=True)]
    x_cols, a_rows = np.split(x, devices, axis=1), np.split(a, devices, axis=0)
    wrong = sum(relu(xc @ ar) for xc, ar in zip(x_cols, a_rows, strict=True)) @ b
    return MlpSplit(partials=partials, reduced=sum(partials), reference=relu(x @ a) @ b, wrong=wrong)


def lesson_column_inputs() -> tuple[np.ndarray, np.ndarray]:
    """Example 2's 2 tokens x hidden 4 input and 4 x 6 weights, w[i][j] = (6i + j) % 5 - 2."""
    x = np.array([[1, 2, 0, -1], [0, 1, 3, 2]], dtype=np.int64)
    i, j = np.indices((4, 6))
    return x, (i * 6 + j) % 5 - 2


def lesson_mlp_inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Example 3's input, up projection 4 -> 8 and down projection 8 -> 4."""
    x, _ = lesson_column_inputs()
    i, j = np.indices((4, 8))
    a = (i * 8 + j) % 7 - 3
    i, j = np.indices((8, 4))
    return x, a, (i * 4 + j) % 5 - 2
