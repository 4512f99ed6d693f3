"""The local connector: ``sluice worker`` processes on this machine, started and stopped by the planner.

Each worker runs in a session of its own, so it outlives the planner: a planner that is killed leaves
the fleet as it is, and the next one adopts it. The connector keeps its workers in a state file
(``workers.json`` in its directory, written whole and renamed), each with its pid and the process's
start time (a recycled pid is not taken for the worker), and each worker's log beside it.

Scaling down sends SIGTERM to the most recently started workers of the pool: a worker drains on
SIGTERM (it takes nothing new, finishes what it runs within ``SLUICE_WORKER__DRAIN_TIMEOUT_S``, and hands
what is left over to other workers: the frontends migrate those streams), so no stream is lost. The
newest workers go first: they hold the least cached KV. A worker being stopped no longer counts for its
pool, and is forgotten once its process has exited.

Usage::

    connector = LocalConnector(run_dir, command=[sys.executable, "-m", "sluice", "worker"], env=os.environ)
    await connector.scale(PoolRef("smollm2", Pool.AGG), 3, "why")
    ...
    await connector.stop_all()   # tests and benches: stop every worker it started, and wait
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from core.pools import Pool
from planner.connectors.base import PoolRef

STATE_FILE = "workers.json"
#: How long ``stop_all`` waits for draining workers before it kills them.
STOP_ALL_TIMEOUT_S = 90.0


@dataclass(frozen=True, slots=True)
class LocalWorker:
    name: str
    model: str
    pool: str
    pid: int
    #: The process's start time as the kernel has it (psutil), which tells it from a later one with its pid.
    created: float
    started_at: float
    stopping: bool = False

    @property
    def ref(self) -> PoolRef:
        return PoolRef(self.model, Pool(self.pool))  # type: ignore[call-arg]  # a lookup by value

    def alive(self) -> bool:
        try:
            proc = psutil.Process(self.pid)
            return bool(abs(proc.create_time() - self.created) < 0.5 and proc.status() != psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return False


class LocalConnector:
    name = "local"

    def __init__(self, run_dir: Path, command: Sequence[str], env: Mapping[str, str]) -> None:
        """``command`` starts one worker (``--name NAME`` is appended); ``env``: its environment, to which
        ``SLUICE_MODEL`` and ``SLUICE_WORKER__POOL`` are added."""
        self.dir = run_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.command = list(command)
        self.env = dict(env)
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._seq = 0
        self.workers: list[LocalWorker] = self._load()

    # ---- state ----
    def _load(self) -> list[LocalWorker]:
        path = self.dir / STATE_FILE
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return []
        workers = [LocalWorker(**w) for w in data.get("workers", [])]
        self._seq = int(data.get("seq", 0))
        return [w for w in workers if w.alive()]

    def _save(self) -> None:
        tmp = self.dir / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps({"seq": self._seq, "workers": [asdict(w) for w in self.workers]}, indent=1))
        os.replace(tmp, self.dir / STATE_FILE)

    def _reap(self) -> None:
        """Forget the workers whose process has exited (and collect the exit of those this process started)."""
        for pid, child in list(self._children.items()):
            if child.poll() is not None:
                del self._children[pid]
        alive = [w for w in self.workers if w.alive()]
        if len(alive) != len(self.workers):
            self.workers = alive
            self._save()

    # ---- the contract ----
    async def current(self, pool: PoolRef) -> int | None:
        self._reap()
        return sum(1 for w in self.workers if w.ref == pool and not w.stopping)

    async def scale(self, pool: PoolRef, replicas: int, reason: str) -> None:
        self._reap()
        serving = sorted((w for w in self.workers if w.ref == pool and not w.stopping), key=lambda w: w.started_at)
        for _ in range(replicas - len(serving)):
            self._start(pool)  # a fork and exec: milliseconds, on the planner's own thread (see _start)
        for worker in reversed(serving[replicas:]):
            self._stop(worker)
        self._save()

    async def aclose(self) -> None:
        """Leave the workers running (the fleet outlives the planner), and their state for the next one."""
        self._reap()

    # ---- processes ----
    def _start(self, pool: PoolRef) -> LocalWorker:
        """Start one worker. From the calling thread, not a pool's: a command that asks the kernel to end
        the worker with the thread that forked it (tests wrap theirs so) must get a thread that lasts."""
        self._seq += 1
        name = f"{pool.model}-{pool.pool.value}-{self._seq}"
        env = {**self.env, "SLUICE_MODEL": pool.model, "SLUICE_WORKER__POOL": pool.pool.value}
        with open(self.dir / f"{name}.log", "ab") as log:
            child = subprocess.Popen([*self.command, "--name", name], env=env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self._children[child.pid] = child
        created = psutil.Process(child.pid).create_time()
        worker = LocalWorker(name, pool.model, pool.pool.value, child.pid, created, time.time())
        self.workers.append(worker)
        return worker

    def _stop(self, worker: LocalWorker) -> None:
        """SIGTERM: the worker drains and exits."""
        if worker.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGTERM)
        self.workers = [w if w is not worker else LocalWorker(**{**asdict(w), "stopping": True}) for w in self.workers]

    async def stop_all(self, timeout_s: float = STOP_ALL_TIMEOUT_S) -> None:
        """Stop every worker this connector knows of (SIGTERM, then SIGKILL to its group after ``timeout_s``),
        and wait for them to exit."""
        for worker in list(self.workers):
            if not worker.stopping:
                self._stop(worker)
        self._save()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._reap()
            if not self.workers:
                return
            await asyncio.sleep(0.2)
        for worker in self.workers:
            if worker.alive():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(worker.pid, signal.SIGKILL)
        await asyncio.sleep(0.2)
        self._reap()
