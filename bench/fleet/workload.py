"""The simulated fleet's request stream, as pure functions of a :class:`FleetWorkload` (no I/O).

Worker ``i`` belongs to prefix group ``i % groups``; its ``k``-th request is the group's shared prefix
(a system prompt every worker of the group has seen) followed by a private suffix (the user's own
turn). Every token comes from a numpy generator seeded with the workload's seed and the position
(group, or worker and request), so any process regenerates exactly the prompts another one sent:
fleet processes share their groups' prefixes, and the benchmark builds decision prompts that are
cached where it expects them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Token ids are drawn from [LOW_TOKEN, HIGH_TOKEN): ordinary ids of the mocker's vocabulary.
LOW_TOKEN, HIGH_TOKEN = 100, 30_000


@dataclass(frozen=True, slots=True)
class FleetWorkload:
    """``groups`` shared prefixes of ``prefix_tokens``; each worker serves ``requests_per_worker``
    requests with suffixes of ``suffix_tokens`` (min, max) and ``output_tokens`` generated tokens."""

    seed: int = 11
    groups: int = 16
    prefix_tokens: int = 2048
    suffix_tokens: tuple[int, int] = (1024, 3072)
    requests_per_worker: int = 6
    output_tokens: int = 2


def _tokens(seed: list[int], n: int) -> list[int]:
    return np.random.default_rng(seed).integers(LOW_TOKEN, HIGH_TOKEN, size=n).tolist()


def group_of(workload: FleetWorkload, worker_index: int) -> int:
    return worker_index % workload.groups


def group_prefix(workload: FleetWorkload, group: int) -> list[int]:
    """The shared prefix of ``group``."""
    return _tokens([workload.seed, 0, group], workload.prefix_tokens)


def worker_prompt(workload: FleetWorkload, worker_index: int, k: int, prefix: list[int] | None = None) -> list[int]:
    """The ``k``-th prompt worker ``worker_index`` serves (``prefix``: its group's, if already made)."""
    lo, hi = workload.suffix_tokens
    rng = np.random.default_rng([workload.seed, 1, worker_index, k])
    suffix = rng.integers(LOW_TOKEN, HIGH_TOKEN, size=int(rng.integers(lo, hi + 1))).tolist()
    return (prefix if prefix is not None else group_prefix(workload, group_of(workload, worker_index))) + suffix


def fresh_tokens(seed: int, n: int) -> list[int]:
    """Tokens no worker has seen (a new user's text), from their own seed space."""
    return _tokens([seed, 2], n)
