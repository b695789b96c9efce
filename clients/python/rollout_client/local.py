"""A whole rollout service on this machine, for tests and examples: the stand-in
inference server (``rollout-scripted-llm``, which plays a scripted policy; it is not a
model) and ``rollout up`` (gateway, workers, reconciler; SQLite; a NATS server it starts
itself when none answers), in a temporary state directory, stopped on exit.

    with LocalService(bin_dir="target/release", policy="examples/agent-policy.json") as svc:
        client = svc.client()
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import List, Optional

from . import RolloutClient


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalService:
    """Starts the stand-in server and ``rollout up`` from the binaries in ``bin_dir``;
    ``policy`` is the stand-in's script. ``url`` is the gateway once started."""

    def __init__(self, bin_dir: str, policy: str, workers: int = 2):
        self.bin_dir = Path(bin_dir)
        self.policy = str(Path(policy).resolve())
        self.workers = workers
        self.url = ""
        self._dir: Optional[str] = None
        self._procs: List[subprocess.Popen] = []

    def __enter__(self) -> "LocalService":
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def client(self) -> RolloutClient:
        """A client of this service's gateway."""
        return RolloutClient(self.url)

    def log(self, name: str) -> str:
        """The text of a process's log (``up`` or ``scripted``), for failure messages."""
        assert self._dir
        path = Path(self._dir) / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _start(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="rollout-client-")
        # mkdtemp makes it private (0700); sandboxes run as their own user and reach
        # their workspaces below it.
        os.chmod(self._dir, 0o755)
        d = Path(self._dir)
        scripted = str(self.bin_dir / "rollout-scripted-llm")
        model = d / "model"
        subprocess.run(
            [scripted, "write-model", str(model), "--policy", self.policy], check=True
        )
        out = d / "scripted.out"
        with open(out, "w") as o, open(d / "scripted.log", "w") as e:
            self._procs.append(
                subprocess.Popen(
                    [scripted, "serve", "--listen", "127.0.0.1:0", "--model", str(model),
                     "--policy", self.policy, "--seed", "0", "--token-us", "100"],
                    stdout=o, stderr=e,
                )
            )
        backend = self._wait_line(out, "listening on ", 20)
        port = _free_port()
        config = d / "rollout.toml"
        config.write_text(
            f'state_dir = "{d / "state"}"\n'
            f'[database]\nurl = "sqlite://{d / "rollout.db"}"\n'
            f'[gateway]\nlisten = "127.0.0.1:{port}"\n'
            f'[nats]\nprefix = "py{uuid.uuid4().hex[:8]}"\n'
            f'[[backends]]\nid = "scripted"\nurl = "{backend}"\nkind = "vllm"\n'
            f'model = "scripted"\ntokenizer = "{model}"\n'
        )
        with open(d / "up.log", "w") as e:
            self._procs.append(
                subprocess.Popen(
                    [str(self.bin_dir / "rollout"), "--config", str(config), "up",
                     "--workers", str(self.workers)],
                    stdout=subprocess.DEVNULL, stderr=e,
                )
            )
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self._procs[-1].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"rollout up did not start:\n{self.log('up')[-4000:]}")
            time.sleep(0.2)

    @staticmethod
    def _wait_line(path: Path, prefix: str, within: float) -> str:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            for line in path.read_text().splitlines():
                if line.startswith(prefix):
                    return line[len(prefix):].strip()
            time.sleep(0.1)
        raise RuntimeError(f"no `{prefix}` line in {path}")

    def stop(self) -> None:
        """Stops the processes (SIGTERM, then SIGKILL) and removes the state."""
        for p in reversed(self._procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self._procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._procs.clear()
        if self._dir and not os.environ.get("ROLLOUT_KEEP_STATE"):
            shutil.rmtree(self._dir, ignore_errors=True)
