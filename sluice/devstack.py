"""A local stack launcher for tests and benchmarks: a private ``redis-server`` on a free port and
the Sluice processes started the way a user starts them (``sluice serve``, ``sluice worker``,
``sluice flower`` subprocesses). Logs go to files under the stack's work directory."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll ``predicate`` until it holds; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@dataclass
class RedisServer:
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sluice-redis-")))

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (make test installs it)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir), "--maxclients", "10000"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("private redis-server did not start") from None
                time.sleep(0.02)
        client.close()
        return self

    def restart(self) -> None:
        """Stop and start again on the same port, losing every key (it keeps nothing on disk)."""
        self.stop()
        self.start()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None
        shutil.rmtree(self.workdir, ignore_errors=True)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


@dataclass
class Stack:
    redis_url: str
    namespace: str
    model_path: Path
    env_extra: dict[str, str] = field(default_factory=dict)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sluice-stack-")))
    port: int = field(default_factory=free_port)
    procs: dict[str, Proc] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        env.update({
            "SLUICE_REDIS_URL": self.redis_url, "SLUICE_NAMESPACE": self.namespace,
            "SLUICE_MODEL_PATH": str(self.model_path), "SLUICE_AUTH": "0", "PYTHONUNBUFFERED": "1",
        })
        env.update(self.env_extra)
        env.update(extra)
        return env

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> Proc:
        log = self.workdir / f"{name}.log"
        popen = subprocess.Popen([sys.executable, "-m", "sluice", *args], cwd=REPO, env=env,
                                 stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
        proc = Proc(name, popen, log)
        self.procs[name] = proc
        return proc

    def start_worker(self, name: str, **env: str) -> Proc:
        return self._spawn(name, ["worker", "--name", name, "--log-level", "warning"], self.env(**env))

    def start_frontend(self, **env: str) -> Proc:
        return self._spawn("frontend", ["serve", "--port", str(self.port), "--log-level", "warning"], self.env(**env))

    def ready_workers(self) -> dict[str, int]:
        try:
            r = httpx.get(f"{self.base_url}/ready", timeout=2)
        except httpx.HTTPError:
            return {}
        return r.json().get("models", {})

    def wait_ready(self, model: str, workers: int, timeout: float = 60) -> None:
        def check() -> bool:
            for p in self.procs.values():
                if not p.alive():
                    raise RuntimeError(f"{p.name} exited ({p.popen.returncode}):\n{p.tail()}")
            return self.ready_workers().get(model, 0) >= workers
        wait_until(check, timeout, f"{workers} live worker(s) of {model}")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[name]
        os.killpg(proc.popen.pid, sig)
        proc.popen.wait(30)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.alive():
                os.killpg(proc.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs.values():
            try:
                proc.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait(5)


def final_delta(watcher: redis.client.PubSub, request_id: str, timeout: float = 10):  # noqa: ANN201
    """The last token delta a worker published for ``request_id``, read from ``watcher`` (a pub/sub
    client psubscribed to the namespace's token channels); None if none came within ``timeout``."""
    from core.messages import decode_delta

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = watcher.get_message(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
        if msg and msg["type"] == "pmessage":
            delta = decode_delta(msg["data"])
            if delta.request_id == request_id and delta.is_last:
                return delta
    return None


def read_then_disconnect(base_url: str, body: dict, events: int = 4, headers: dict[str, str] | None = None) -> str:
    """Open a streaming chat completion, read ``events`` data events, then hang up like a client
    that went away; returns the request id (the chunk id without its ``chatcmpl-`` prefix)."""
    import orjson

    request_id, seen = "", 0
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=30, headers=headers) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                request_id = orjson.loads(line[6:])["id"].removeprefix("chatcmpl-")
                seen += 1
                if seen == events:
                    break
    return request_id
