"""`flotilla k8s` as a user runs it: one stream on stdout, a folder or a file with -o, one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import REPO

K8S = REPO / "deploy" / "k8s"


def flotilla(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flotilla", *argv], capture_output=True, text=True, timeout=120)


def test_k8s_writes_the_committed_manifests_into_the_folder_named_by_o(tmp_path: Path) -> None:
    out = flotilla("k8s", "-o", str(tmp_path / "k8s"))
    assert out.returncode == 0 and out.stdout == "", out.stderr
    written = sorted(p.name for p in (tmp_path / "k8s").iterdir())
    assert written == sorted(p.name for p in K8S.glob("*.yaml")) == ["engines.yaml", "proxy.yaml"]
    for name in written:
        assert (tmp_path / "k8s" / name).read_text() == (K8S / name).read_text(), name


def test_k8s_scaler_keda_and_hpa_write_the_committed_folders(tmp_path: Path) -> None:
    for scaler in ("keda", "hpa"):
        out = flotilla("k8s", "--scaler", scaler, "-o", str(tmp_path / scaler))
        assert out.returncode == 0 and out.stdout == "", out.stderr
        written = sorted(p.name for p in (tmp_path / scaler).iterdir())
        assert written == ["engines.yaml", f"{scaler}.yaml", "proxy.yaml"]
        for name in written:
            assert (tmp_path / scaler / name).read_text() == (K8S / scaler / name).read_text(), name
    assert flotilla("k8s", "--scaler", "argo").returncode == 2


def test_k8s_prints_every_manifest_as_one_stream_for_kubectl_apply(tmp_path: Path) -> None:
    out = flotilla("k8s")
    assert out.returncode == 0, out.stderr
    committed = [d for name in ("engines.yaml", "proxy.yaml") for d in yaml.safe_load_all((K8S / name).read_text())]
    assert list(yaml.safe_load_all(out.stdout)) == committed
    single = tmp_path / "fleet.yaml"
    assert flotilla("k8s", "-o", str(single)).returncode == 0
    assert single.read_text() == out.stdout


def test_a_bad_fleet_file_is_one_line_naming_the_file_and_the_field(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("engines:\n  - {name: Big, flavor: vllm, model: llama-3.1-8b}\n")
    out = flotilla("k8s", str(path))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith(f"flotilla k8s: error: {path}: engines[0].name='Big': must be a DNS label")
    assert out.stderr.count("\n") == 1
