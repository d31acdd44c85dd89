from __future__ import annotations

import json

from flotilla.cli import main

SEED_EXAMPLE_6 = """\
4 stages, 1 micro-batch(es), 4 time slots
  GPU 0 | m0  .  .  .
  GPU 1 |  . m0  .  .
  GPU 2 |  .  . m0  .
  GPU 3 |  .  .  . m0
  busy 4 of 16 stage-slots (25.0%)
4 stages, 4 micro-batch(es), 7 time slots
  GPU 0 | m0 m1 m2 m3  .  .  .
  GPU 1 |  . m0 m1 m2 m3  .  .
  GPU 2 |  .  . m0 m1 m2 m3  .
  GPU 3 |  .  .  . m0 m1 m2 m3
  busy 16 of 28 stage-slots (57.1%)
"""
SEED_EXAMPLE_7 = """\
busy share m / (m + p - 1) for one batch split into m micro-batches
stages p     m=1     m=2     m=4     m=8    m=16    m=32
       2    50.0%   66.7%   80.0%   88.9%   94.1%   97.0%
       4    25.0%   40.0%   57.1%   72.7%   84.2%   91.4%
       8    12.5%   22.2%   36.4%   53.3%   69.6%   82.1%
steady decoding on 4 stages, k batches in flight, 8 sequences per batch, 1 slot per stage
  k=1: GPUs busy  25%, 200 tokens per 100 slots, each sequence gets a token every 4 slots
  k=2: GPUs busy  50%, 400 tokens per 100 slots, each sequence gets a token every 4 slots
  k=3: GPUs busy  75%, 600 tokens per 100 slots, each sequence gets a token every 4 slots
  k=4: GPUs busy 100%, 800 tokens per 100 slots, each sequence gets a token every 4 slots
"""


def test_issue_command_prints_example_7(capsys):
    assert main(["plan", "pipeline", "--stages", "2,4,8", "--micro-batches", "1,2,4,8,16,32"]) == 0
    assert capsys.readouterr().out == SEED_EXAMPLE_7


def test_timeline_draws_example_6(capsys):
    assert main(["plan", "pipeline", "--timeline"]) == 0
    assert capsys.readouterr().out == SEED_EXAMPLE_6


def test_timeline_json_for_another_shape(capsys):
    assert main(["plan", "pipeline", "--timeline", "2x3", "--json"]) == 0
    (t,) = json.loads(capsys.readouterr().out)
    assert t["cells"] == [[0, 1, 2, None], [None, 0, 1, 2]]
    assert t["busy_share"] == 0.75


def test_zero_stages_is_an_error(capsys):
    assert main(["plan", "pipeline", "--stages", "0,4"]) == 2
    assert "--stages" in capsys.readouterr().err
