"""The parent's side of ``python -m bench.fleet --control``: start fleet processes, send them commands,
read their one-line JSON answers, stop them (and kill whatever is left if the parent fails)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

#: The repository root: fleet processes import the same code as their parent.
ROOT = Path(__file__).resolve().parents[2]
#: How long a fleet may take to answer one command (a drive of a few thousand workers included).
ANSWER_TIMEOUT_S = 300.0
#: How long a fleet may take to purge and deregister its workers before it is killed.
STOP_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class FleetLaunch:
    """One process's workers ``first`` .. ``first + workers - 1``; ``extra``: more command-line flags."""

    redis_url: str
    namespace: str
    first: int
    workers: int
    extra: tuple[str, ...] = ()
    #: Added to the process's niceness: the simulated workers stand for other machines, so the router
    #: and Redis being measured get the CPU first and the fleets what is left.
    nice: int = 10


class FleetProcess:
    def __init__(self, launch: FleetLaunch, proc: asyncio.subprocess.Process, started: dict) -> None:
        self.launch, self.proc, self.started = launch, proc, started

    @classmethod
    async def start(cls, launch: FleetLaunch) -> FleetProcess:
        """Start the process; returns once its workers are registered (its ``started`` answer)."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.fleet", "--control", "--redis-url", launch.redis_url,
            "--namespace", launch.namespace, "--first", str(launch.first), "--workers", str(launch.workers),
            *launch.extra, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=ROOT, env=env,
            preexec_fn=(lambda: os.nice(launch.nice)) if launch.nice else None)
        try:
            started = await _answer(proc, "started")
        except BaseException:
            _kill(proc)
            raise
        return cls(launch, proc, started)

    async def command(self, command: str, expect: str) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{command}\n".encode())
        await self.proc.stdin.drain()
        return await _answer(self.proc, expect)

    async def stop(self) -> dict:
        """Close its input (``stop``): it purges and deregisters its workers; returns its lease figures."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            answer = await _answer(self.proc, "stopped", STOP_TIMEOUT_S)
            async with asyncio.timeout(30):
                await self.proc.wait()
            return answer
        finally:
            _kill(self.proc)


async def _answer(proc: asyncio.subprocess.Process, expect: str, timeout_s: float = ANSWER_TIMEOUT_S) -> dict:
    assert proc.stdout is not None
    while True:
        async with asyncio.timeout(timeout_s):
            line = await proc.stdout.readline()
        if not line:
            raise RuntimeError(f"fleet process {proc.pid} exited (code {await proc.wait()}) before answering {expect!r}")
        with contextlib.suppress(ValueError):
            answer = json.loads(line)
            if answer.get("event") == expect:
                return answer


def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()


class Fleets:
    """Every fleet process the benchmark started, as one."""

    def __init__(self) -> None:
        self.processes: list[FleetProcess] = []

    @property
    def workers(self) -> int:
        return sum(p.launch.workers for p in self.processes)

    async def grow(self, launches: list[FleetLaunch]) -> list[FleetProcess]:
        """Start these processes at once; returns them once all are registered."""
        results = await asyncio.gather(*(FleetProcess.start(launch) for launch in launches), return_exceptions=True)
        started = [r for r in results if isinstance(r, FleetProcess)]
        self.processes += started
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
        return started

    async def command(self, processes: list[FleetProcess], command: str, expect: str) -> list[dict]:
        return list(await asyncio.gather(*(p.command(command, expect) for p in processes)))

    async def stop(self) -> list[dict]:
        processes, self.processes = self.processes, []
        results = await asyncio.gather(*(p.stop() for p in processes), return_exceptions=True)
        return [r for r in results if isinstance(r, dict)]

    def kill(self) -> None:
        for p in self.processes:
            _kill(p.proc)
