import subprocess
import sys

import pytest

from flotilla.cli import build_parser, main


def test_unknown_subcommand_exits_with_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_every_registered_subcommand_has_help() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert "plan" in sub.choices
    for name, p in sub.choices.items():
        assert p.description, name


def test_module_entry_point_runs_as_a_subprocess() -> None:
    out = subprocess.run([sys.executable, "-m", "flotilla", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert "plan" in out.stdout
