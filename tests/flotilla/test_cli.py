import subprocess
import sys
from pathlib import Path

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


BAD_YAML = "models: [\n  - {name: x\n"


@pytest.mark.parametrize("argv,cause", [
    (["no-such-command"], "flotilla: error: argument COMMAND: invalid choice: 'no-such-command'"),
    (["proxy", "--port", "x"], "flotilla proxy: error: argument --port: invalid port 'x'"),
    (["sim", "--trace", "{missing}", "--replicas", "0"], "flotilla sim: error: argument --replicas: invalid value 0"),
    (["sim", "--trace", "{missing}"], "flotilla sim: error: [Errno 2] No such file or directory: '{missing}'"),
    (["sim", "--trace", "{trace}", "--catalogue", "{bad_yaml}"], "flotilla sim: error: {bad_yaml}:2:3: invalid YAML"),
    (["sim", "--trace", "{trace}", "--slo", "ttft"], "flotilla sim: error: bad SLO 'ttft'"),
    (["sim", "--synthetic", "agents:sessions=x"], "flotilla sim: error: synthetic workload 'agents:sessions=x': "),
    (["loadgen", "convert"], "flotilla loadgen convert: error: the following arguments are required: input, output"),
    (["loadgen", "--target", "127.0.0.1:8000", "--trace", "{trace}"], "flotilla loadgen: error: --target '127.0.0.1:8000'"),
    (["loadgen", "compare", "{bad_yaml}"], "flotilla loadgen: error: {bad_yaml}: not a result file"),
    (["plan", "fit", "--bits", "x"], "flotilla plan fit: error: argument --bits: invalid float value: 'x'"),
    (["plan", "fit", "--catalogue", "{bad_yaml}"], "flotilla plan fit: error: {bad_yaml}:2:3: invalid YAML"),
    (["plan", "fit", "--catalogue", "{missing}"], "flotilla plan fit: error: {missing}: cannot read: No such file"),
    (["up", "{bad_yaml}"], "flotilla up: error: {bad_yaml}:2:3: invalid YAML"),
    (["up", "{missing}"], "flotilla up: error: {missing}: cannot read: No such file"),
    (["up", "{wrong_type}"], "flotilla up: error: {wrong_type}: engines[0].replicas='two': must be int"),
])
def test_common_mistakes_of_every_subcommand_are_one_line_and_exit_status_2(tmp_path: Path, argv: list[str],
                                                                            cause: str) -> None:
    files = {"missing": tmp_path / "missing.yaml", "bad_yaml": tmp_path / "bad.yaml",
             "wrong_type": tmp_path / "fleet.yaml", "trace": tmp_path / "trace.jsonl"}
    files["bad_yaml"].write_text(BAD_YAML)
    files["wrong_type"].write_text("engines:\n  - {flavor: vllm, model: llama-3.2-1b, replicas: two}\n")
    files["trace"].write_text('{"timestamp_s": 0, "input_length": 8, "output_length": 2}\n')
    out = subprocess.run([sys.executable, "-m", "flotilla", *(a.format(**files) for a in argv)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith(cause.format(**files)), out.stderr
