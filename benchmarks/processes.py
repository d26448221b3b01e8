"""The processes a benchmark or a test starts and watches: a server (`mtserve serve`, or the same
server decoding with CTranslate2) on a free loopback port, its replicas and children, their CPU
time from /proc, and a stop that lets it drain."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from service.client.healthcheck import wait_serving

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BACKENDS = {
    "ort": ["-m", "mtserve", "serve"],  # mtserve serve: ONNX Runtime
    "ct2": ["-m", "benchmarks.ct2_server"],  # the same server decoding with CTranslate2
}


class Server:
    """`mtserve serve` (backend "ort") or the same server decoding with CTranslate2
    (benchmarks/ct2_server.py, backend "ct2") in a subprocess on 127.0.0.1:<free port>, metrics off,
    warnings only (flags in `args` come last, so they override those). `model_dir` is the one model
    dir it serves, or with `models` (NAME or NAME:VERSION) the model repository they are loaded from."""

    def __init__(
        self,
        model_dir: str | Path,
        args: Sequence[str] = (),
        env: dict | None = None,
        log_prefix: str = "mtserve-bench-",
        backend: str = "ort",
        models: Sequence[str] = (),
        tree: Path = REPO,
    ):
        """`tree`: the source tree the server runs (another revision's worktree: benchmarks/ab_trees.py)."""
        self.address = f"127.0.0.1:{free_port()}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix=log_prefix, suffix=".log", delete=False)
        cmd = [
            sys.executable,
            *BACKENDS[backend],
            "--address",
            self.address,
            "--metrics-port",
            "0",
            *(
                ["--model-repository", str(model_dir), "--models", ",".join(models)]
                if models
                else ["--model-dir", str(model_dir)]
            ),
            "--log-level",
            "warning",
            *args,
        ]
        self.cmd = cmd
        if tree != REPO:  # its own modules first: `-m` puts the cwd first, PYTHONPATH the children too
            env = {"PYTHONPATH": str(tree), **(env or {})}
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=tree, env={**os.environ, **(env or {})}
        )
        self.pid = self.proc.pid

    def wait_ready(self, timeout: float = 120) -> None:
        """Until the server reports SERVING (after its warm-up); RuntimeError with the end of its
        log when it exits or does not get there in time."""
        try:
            wait_serving(self.address, timeout, alive=lambda: self.proc.poll() is None)
        except RuntimeError:
            raise RuntimeError(f"server exited with {self.proc.returncode}: {self.tail()}") from None
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"server not ready after {timeout}s: {self.tail()}") from None

    def tail(self, n: int = 20) -> str:
        self.log.flush()
        return "".join(Path(self.log.name).read_text(errors="replace").splitlines(True)[-n:])

    def stop(self) -> int:
        return terminate(self.proc, 30)

    def __enter__(self) -> Server:
        self.wait_ready()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def process_cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) used so far by process `pid` (None: this one), all threads, and
    by its live child processes (a server's replicas or engine processes)."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    try:
        own = stat_cpu_s(Path(f"/proc/{pid}/stat"))
    except FileNotFoundError:  # it exited meanwhile
        return 0.0
    return own + sum(process_cpu_s(child) for child in child_pids(pid))


def stat_cpu_s(stat: Path) -> float:
    """User + system CPU seconds in a /proc `stat` file (a process's or one of its threads');
    FileNotFoundError once it has exited."""
    fields = stat.read_text().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def terminate(proc: subprocess.Popen, timeout: float) -> int:
    """SIGTERM (the server drains), SIGKILL after `timeout` seconds; the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def replica_pids(pid: int) -> list[int]:
    """The replicas of server `pid` when it supervises them (`--replicas`): the children that
    multiprocessing spawned, not its resource tracker. Empty for a server that serves itself."""
    replicas = []
    for child in child_pids(pid):
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                replicas.append(child)
        except FileNotFoundError:  # it exited meanwhile
            continue
    return replicas


def child_pids(pid: int) -> list[int]:
    """The live child processes of `pid`, whichever of its threads started them."""
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return kids
