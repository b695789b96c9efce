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
from typing import Dict, List, Optional

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
        # A short name: the sandboxes' sockets live under `<dir>/state/sb` and Unix
        # sockets allow 100 bytes, so a long one would send them to a directory of the
        # service's choosing outside it (see the README's `sandbox.root`).
        self._dir = tempfile.mkdtemp(prefix="rc-")
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
        """Stops the processes as an operator would: SIGTERM to ``rollout up`` first (it
        hands its work back and removes its sandboxes, with their mounted workspaces and
        loop devices), waiting for it, then the stand-in server; SIGKILL only for one that
        outstays two minutes. Then removes the state, unless something of the service's
        is still there: a workspace still mounted would have its image deleted under its
        loop device, so that is an error naming what is left, and the state stays."""
        for p in reversed(self._procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._procs.clear()
        if not self._dir:
            return
        left = self.leftovers()
        if any(left.values()):
            raise RuntimeError(f"the local service left behind (state kept in {self._dir}): {left}")
        if not os.environ.get("ROLLOUT_KEEP_STATE"):
            shutil.rmtree(self._dir, ignore_errors=True)

    def leftovers(self, wait: float = 30) -> Dict[str, List[str]]:
        """What of this service is on the machine: processes naming its directory (or
        sandboxes binding from it), mounts below it and loop devices backed by files
        in it. Waits up to ``wait`` seconds for them to go (a loop device is released
        once the last process holding its mount is gone)."""
        deadline = time.monotonic() + wait
        while True:
            left = _leftovers(self._dir or "")
            if not any(left.values()) or time.monotonic() > deadline:
                return left
            time.sleep(0.2)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _leftovers(root: str) -> Dict[str, List[str]]:
    """Processes, mounts and loop devices of the directory ``root`` (see ``leftovers``)."""
    left: Dict[str, List[str]] = {"processes": [], "mounts": [], "loop_devices": []}
    if not root:
        return left
    root = os.path.realpath(root)
    name = os.path.basename(root)

    def read(path: str) -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError:
            return b""

    def link(path: str) -> str:
        try:
            return os.readlink(path)
        except OSError:
            return ""

    my_ns = link("/proc/self/ns/mnt")
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        cmdline = read(f"/proc/{pid}/cmdline")
        if not cmdline:
            continue
        named = root.encode() in cmdline or root.encode() in read(f"/proc/{pid}/environ")
        named = named or _under(link(f"/proc/{pid}/cwd"), root)
        if not named and link(f"/proc/{pid}/ns/mnt") not in ("", my_ns):
            # A sandbox sees none of the host's paths; its mount table says where its
            # binds come from.
            for line in read(f"/proc/{pid}/mountinfo").decode(errors="replace").splitlines():
                fields = line.split(" ")
                if len(fields) > 3 and (_under(fields[3], root) or name in fields[3].split("/")):
                    named = True
                    break
        if named:
            cmd = cmdline.replace(b"\0", b" ").decode(errors="replace")[:200]
            left["processes"].append(f"{pid} {cmd}")
    for line in read("/proc/self/mountinfo").decode(errors="replace").splitlines():
        fields = line.split(" ")
        if len(fields) > 4:
            point = fields[4].replace("\\040", " ")
            if _under(point, root):
                left["mounts"].append(point)
    try:
        devices = os.listdir("/sys/block")
    except OSError:
        devices = []
    for dev in devices:
        backing = read(f"/sys/block/{dev}/loop/backing_file").decode(errors="replace").strip()
        if backing and _under(backing.removesuffix(" (deleted)"), root):
            left["loop_devices"].append(f"/dev/{dev} -> {backing}")
    return left
