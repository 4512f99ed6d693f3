"""A local stack launcher for tests and benchmarks: a private ``redis-server`` on a free port and
the Sluice processes started the way a user starts them (``sluice serve``, ``sluice worker``,
``sluice flower`` subprocesses). Logs go to files under the stack's work directory.

Usage::

    redis = RedisServer().start()
    stack = Stack(redis_url=redis.url, namespace="demo", model_path=tokenizer_dir)
    try:
        stack.start_worker("w1")
        stack.start_frontend()
        stack.wait_ready("smollm2", workers=1)
        ...
    finally:
        stack.stop()
        redis.stop()

Cleanup, whatever happens: every process started here (Redis included) leads a process group of
its own, so that it is stopped together with its own children (vLLM's engine core) and so that a
signal sent to the launcher's group (``make`` interrupted) reaches the launcher alone, which then
stops them in order: a stack before the Redis it uses, or its workers would hang in their shutdown.
``stop()`` ends the processes (SIGTERM to each group, SIGKILL after a grace period) and removes
their temporary directory. Whatever is not stopped explicitly is stopped when the launcher's
process exits: at a normal end, after an uncaught exception, on Ctrl-C (SIGINT), and on SIGTERM or
SIGHUP, which the first object created here turns into :class:`Terminated` (a KeyboardInterrupt,
so ``finally`` blocks and pytest's fixture teardowns run as they do for Ctrl-C) where the process
left those signals at their default. Even SIGKILL of the launcher leaves nothing running: each
process is started with a parent-death signal (``setpriv --pdeathsig TERM``, Linux), so it gets
SIGTERM when the launcher's thread that started it is gone, and stops as it would on Ctrl-C.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import httpx
import redis

from core.shm import ShmEntries, descendants, process_table

REPO = Path(__file__).resolve().parents[1]


#: Signals that end a launcher politely (a supervisor, ``make`` interrupted, a closed terminal).
EXIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
#: How long stopped processes get to exit after SIGTERM before SIGKILL.
STOP_GRACE_S = 15.0
#: How long what a process started may take to end by itself once the process was killed alone (a vLLM
#: engine core exits cleanly on its SIGTERM; beside a busy test run that once took over 30 s). The bound
#: says that it ends, not how fast.
ALONE_EXIT_S = 90.0


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: unwinds the launcher like Ctrl-C, so its cleanup runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


class Stoppable(Protocol):
    def stop(self) -> None: ...


_started: dict[int, Stoppable] = {}
_exit_hooks_installed = False


def stop_at_exit(thing: Stoppable) -> None:
    """Stop ``thing`` when this process exits, unless it was stopped before (its ``stop`` calls
    :func:`forget`). Idempotent. The first call installs the exit hooks (module docstring)."""
    global _exit_hooks_installed
    if not _exit_hooks_installed:
        atexit.register(stop_everything)
        if threading.current_thread() is threading.main_thread():
            for signum in EXIT_SIGNALS:
                if signal.getsignal(signum) is signal.SIG_DFL:
                    signal.signal(signum, _terminate)
        _exit_hooks_installed = True
    _started[id(thing)] = thing


def forget(thing: Stoppable) -> None:
    """``thing`` is stopped: nothing is left to do for it at exit."""
    _started.pop(id(thing), None)


def _terminate(signum: int, frame: object) -> None:
    for s in EXIT_SIGNALS:  # a second signal must not cut the cleanup short
        signal.signal(s, signal.SIG_IGN)
    raise Terminated(signum)


def stop_everything() -> None:
    """Stop, newest first (a stack before the Redis it uses), whatever is still running."""
    for thing in reversed(list(_started.values())):
        try:
            thing.stop()
        except Exception as exc:  # noqa: BLE001 - at exit, stop the rest and say what failed
            print(f"bench.devstack: could not stop {thing!r}: {exc}", file=sys.stderr)
        forget(thing)


#: Ports handed out by :func:`free_port` in this process, so that two calls never return the same one.
_handed_out: set[int] = set()
_FIXED_PORTS_FROM = 10_000


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for port-0 binds and outgoing connections (Linux; a common default elsewhere)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def port_is_free(port: int) -> bool:
    """Whether a loopback listener could bind ``port`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(companion_offset: int = 0) -> int:
    """A loopback port free now and outside the kernel's ephemeral range; with ``companion_offset``,
    one whose ``port + companion_offset`` is free and outside that range too (a Redis Cluster node's
    bus port is its port + 10000).

    The port is bound later by another process. Had it come from a port-0 bind it would lie in the
    ephemeral range, where the kernel may hand it meanwhile to any port-0 listener (a worker's
    metrics endpoint) or outgoing connection; below that range only explicit binds take ports.
    """
    low, _high = _ephemeral_range()
    rng = random.Random()
    top = low - companion_offset
    if top - _FIXED_PORTS_FROM > 1_000:
        for _ in range(200):
            port = rng.randrange(_FIXED_PORTS_FROM, top)
            pair = {port, port + companion_offset}
            if not pair & _handed_out and all(map(port_is_free, pair)):
                _handed_out.update(pair)
                return port
    if companion_offset:
        raise RuntimeError(f"no free port pair {companion_offset} apart below the ephemeral range ({low})")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _handed_out.add(port)
    return port


def with_parent_death_signal(argv: list[str]) -> list[str]:
    """``argv`` run so that it gets SIGTERM when the calling thread ends (Linux ``PR_SET_PDEATHSIG``
    through util-linux's ``setpriv``, which then executes ``argv`` in place: the pid is the
    command's). Only from the main thread, whose end is the launcher's: the kernel ties the signal to
    the forking thread, so a helper thread's exit would otherwise end the process early. Unchanged
    where ``setpriv`` is missing."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or threading.current_thread() is not threading.main_thread():
        return argv
    return [setpriv, "--pdeathsig", "TERM", "--", *argv]


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll ``predicate`` until it holds; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@dataclass
class RedisServer:
    """A private ``redis-server`` that keeps nothing on disk; ``stop()`` removes its directory."""

    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sluice-redis-")))

    def __post_init__(self) -> None:
        stop_at_exit(self)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (make test installs it)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        stop_at_exit(self)  # again, if it was stopped before
        self.proc = subprocess.Popen(
            with_parent_death_signal([exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir), "--maxclients", "10000"]),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
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
        self._halt()
        self.start()

    def stop(self) -> None:
        self._halt()
        shutil.rmtree(self.workdir, ignore_errors=True)
        forget(self)

    def _halt(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
            self.proc = None


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

    def wait_serving(self, url: str, what: str, timeout: float, interval: float = 0.05) -> None:
        """Until ``GET url`` answers 200; fails at once, with the end of the log, if the process exited."""
        def up() -> bool:
            if not self.alive():
                raise RuntimeError(f"{what} exited ({self.popen.returncode}):\n{self.tail()}")
            try:
                return httpx.get(url, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, timeout, what, interval=interval)


@dataclass
class Processes:
    """Subprocesses started together, each the leader of a session of its own, each logging to
    ``{workdir}/{name}.log``. ``stop()`` ends them all and removes ``workdir``; it also runs when
    the launcher exits (module docstring)."""

    prefix: str = "sluice-"
    procs: dict[str, Proc] = field(default_factory=dict)
    workdir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=self.prefix))
        stop_at_exit(self)

    def spawn(self, name: str, argv: list[str], env: dict[str, str], cwd: Path = REPO) -> Proc:
        self.workdir.mkdir(parents=True, exist_ok=True)
        stop_at_exit(self)
        log = self.workdir / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(with_parent_death_signal(argv), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        proc = Proc(name, popen, log)
        self.procs[name] = proc
        return proc

    def kill(self, name: str, sig: int = signal.SIGKILL, *, alone: bool = False) -> None:
        """Signal the process's group and wait for it to exit. The /dev/shm segments its processes
        held and nothing holds afterwards are removed (a killed vLLM engine leaves its message
        queues' segments behind: what a crash leaves, not what the test looks at).

        ``alone``: signal the process only, as the OOM killer or ``kill -9 PID`` does; what it started
        must end by itself within :data:`ALONE_EXIT_S` (AssertionError otherwise, after killing the rest)."""
        proc = self.procs[name]
        held = ShmEntries.held_by([proc.popen.pid, *descendants(proc.popen.pid)])
        if alone:
            proc.popen.send_signal(sig)
            proc.popen.wait(30)
            if not _wait_group_gone(proc.popen.pid, ALONE_EXIT_S):
                left = _group_members(proc.popen.pid)
                os.killpg(proc.popen.pid, signal.SIGKILL)
                raise AssertionError(f"{name}'s processes {left} outlived it")
        else:
            os.killpg(proc.popen.pid, sig)
            proc.popen.wait(30)
            if sig == signal.SIGKILL:
                _wait_group_gone(proc.popen.pid, 10)
        if sig == signal.SIGKILL:
            held.remove_orphans()

    def signal(self, name: str, sig: int) -> None:
        """Signal the process's group without waiting (SIGSTOP, SIGCONT)."""
        _signal_group(self.procs[name], sig)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM to each process alone, as a supervisor sends it (a Sluice process stops its own
        children: a vLLM worker shuts its engine down, which then removes what it made); after
        ``grace_s`` SIGKILL to the group of each one still running. What a group holds once its
        leader exited gets SIGTERM, then SIGKILL."""
        for proc in self.procs.values():
            if proc.alive():
                proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            try:
                proc.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.popen.wait(5)
        for proc in self.procs.values():
            if not _wait_group_gone(proc.popen.pid, 5):
                _signal_group(proc, signal.SIGTERM)
                if not _wait_group_gone(proc.popen.pid, 5):
                    _signal_group(proc, signal.SIGKILL)
                    _wait_group_gone(proc.popen.pid, 5)
        shutil.rmtree(self.workdir, ignore_errors=True)
        forget(self)


def _wait_group_gone(pgid: int, timeout: float) -> bool:
    """Whether process group ``pgid`` has no process left (zombies aside) within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if not _group_members(pgid):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of group ``pgid``."""
    return [p.pid for p in process_table() if p.pgid == pgid and p.state not in ("Z", "X")]


def _signal_group(proc: Proc, sig: int) -> None:
    """Signal the process's whole group (its own children too); it may have exited already."""
    try:
        os.killpg(proc.popen.pid, sig)
    except ProcessLookupError:
        pass


@dataclass
class Stack:
    """Sluice processes (``python -m sluice ...``) against one Redis and namespace."""

    redis_url: str
    namespace: str
    model_path: Path
    env_extra: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    processes: Processes = field(default_factory=lambda: Processes(prefix="sluice-stack-"))

    @property
    def procs(self) -> dict[str, Proc]:
        return self.processes.procs

    @property
    def workdir(self) -> Path:
        return self.processes.workdir

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
        return self.processes.spawn(name, [sys.executable, "-m", "sluice", *args], env)

    def start_worker(self, name: str, **env: str) -> Proc:
        return self._spawn(name, ["worker", "--name", name, "--log-level", "warning"], self.env(**env))

    def start_frontend(self, **env: str) -> Proc:
        return self._spawn("frontend", ["serve", "--port", str(self.port), "--log-level", "warning"], self.env(**env))

    def start_router(self, port: int, **env: str) -> Proc:
        """``sluice router`` (the standalone routing service) on ``port``, named ``router``."""
        return self._spawn("router", ["router"], self.env(SLUICE_ROUTER__PORT=str(port), **env))

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

    def kill(self, name: str, sig: int = signal.SIGKILL, *, alone: bool = False) -> None:
        self.processes.kill(name, sig, alone=alone)

    def signal(self, name: str, sig: int) -> None:
        self.processes.signal(name, sig)

    def stop(self) -> None:
        self.processes.stop()


def final_delta(watcher: redis.client.PubSub, request_id: str | None, timeout: float = 10):  # noqa: ANN201
    """The last token delta a worker published for ``request_id`` (None: for any request), read from
    ``watcher`` (a pub/sub client psubscribed to the namespace's token channels); None if none came
    within ``timeout``."""
    from core.messages import decode_deltas

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = watcher.get_message(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
        if msg and msg["type"] == "pmessage":
            for delta in decode_deltas(msg["data"]):
                if delta.is_last and request_id in (None, delta.request_id):
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
