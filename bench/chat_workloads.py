"""The traces the routing-quality benchmark replays (bench.router_quality), seeded and pure.

* :func:`shared_workload`: multi-turn chat in the shape of Mooncake's conversation trace, long prompts
  that are mostly reused history, with system prompts shared by groups of users;
* :func:`unique_workload`: single-turn prompts that share nothing.

A :class:`Workload` is a list of conversations; a conversation is its turns in order, each turn what
the user adds (its tokens) and how long the engine answers. The replay builds each prompt as the whole
conversation so far: system prompt, every turn's tokens and every reply.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Turn:
    user: int
    arrival_s: float  # model seconds; for follow-up turns: think time after the previous turn ended
    new_tokens: list[int]
    output_tokens: int


@dataclass
class Workload:
    name: str
    conversations: list[list[Turn]]
    system: dict[int, list[int]] = field(default_factory=dict)  # user -> system prompt tokens


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 49_000) for _ in range(n)]


def _think(rng: random.Random, mean_s: float) -> float:
    """Exponential think time, clipped to [0.2, 3] × the mean (no instant replies, no users gone for good)."""
    return min(max(rng.expovariate(1 / mean_s), 0.2 * mean_s), 3 * mean_s)


def shared_workload(workers: int, seed: int, *, users_per_worker: int, turns: int, duration_s: float,
                    system_tokens: int, users_per_system: int, first_tokens: tuple[int, int],
                    user_tokens: tuple[int, int], output_tokens: tuple[int, int], think_s: float) -> Workload:
    """Chat in the shape of Mooncake's conversation trace: long prompts that are mostly reused history.

    ``users_per_worker × workers`` users start at uniform times over ``duration_s``; each talks for
    ``turns`` turns (half of them one or two turns fewer or more). The first turn brings the user's own
    context, ``first_tokens`` (uniform range: a pasted document, code, an earlier session), each later one
    a question of ``user_tokens``; the engine answers ``output_tokens`` (uniform); the next prompt is the whole conversation so far, system prompt and answers included, so
    histories grow to several thousand tokens. Think time between a reply and the next turn is
    exponential with mean ``think_s`` (clipped). One system prompt of 0.5-1.5 × ``system_tokens`` per
    ``users_per_system`` users (random groups)."""
    rng = random.Random(seed)
    n_users = users_per_worker * workers
    systems = [_tokens(rng, rng.randrange(system_tokens // 2, system_tokens * 3 // 2))
               for _ in range(max(1, n_users // users_per_system))]
    w = Workload("shared", [])
    for u in range(n_users):
        w.system[u] = systems[rng.randrange(len(systems))]
        n_turns = max(1, turns + rng.choice((-2, -1, 0, 0, 0, 0, 1, 2)))
        convo = []
        for k in range(n_turns):
            gap = rng.uniform(0, duration_s) if k == 0 else _think(rng, think_s)
            added = rng.randrange(*(user_tokens if k else first_tokens))
            convo.append(Turn(u, gap, _tokens(rng, added), rng.randrange(*output_tokens)))
        w.conversations.append(convo)
    return w


def unique_workload(workers: int, seed: int, *, requests_per_worker: int, duration_s: float,
                    prompt_tokens: tuple[int, int], output_tokens: tuple[int, int]) -> Workload:
    """Single-turn prompts of ``prompt_tokens`` (uniform range) random tokens, nothing shared, arriving at
    uniform random times over ``duration_s`` (a Poisson process, conditioned on the count)."""
    rng = random.Random(seed + 1)
    w = Workload("unique", [])
    for u in range(requests_per_worker * workers):
        w.system[u] = []
        w.conversations.append([Turn(u, rng.uniform(0, duration_s), _tokens(rng, rng.randrange(*prompt_tokens)),
                                     rng.randrange(*output_tokens))])
    return w


def working_set_tokens(workload: Workload, output_mean: float) -> int:
    """Peak, over the trace's timeline, of the tokens of every live conversation (started and not yet at
    its last turn), distinct system prompts counted once; replies taken as instant and ``output_mean``
    long. A lower bound of what the cluster must hold for every follow-up turn to hit."""
    events: list[tuple[float, int, int]] = []  # (time, conversation, tokens after this turn)
    for c, convo in enumerate(workload.conversations):
        t, size = 0.0, len(workload.system[convo[0].user])
        for turn in convo:
            t += turn.arrival_s
            size += len(turn.new_tokens) + int(output_mean)
            events.append((t, c, size))
    live: dict[int, int] = {}
    last = {c: len(convo) for c, convo in enumerate(workload.conversations)}
    seen: dict[int, int] = {}
    peak = 0
    for _, c, size in sorted(events):
        seen[c] = seen.get(c, 0) + 1
        live[c] = size
        systems = {id(workload.system[workload.conversations[i][0].user]): len(workload.system[
            workload.conversations[i][0].user]) for i in live}
        peak = max(peak, sum(live.values()) - sum(len(workload.system[workload.conversations[i][0].user])
                                                   for i in live) + sum(systems.values()))
        if seen[c] == last[c]:
            del live[c]
    return peak


def prefix_workload(seed: int, *, prompts: int, prompt_tokens: tuple[int, int], requests: int, duration_s: float,
                    question_tokens: tuple[int, int], output_tokens: tuple[int, int], zipf_s: float = 1.0) -> Workload:
    """Shared prefixes: single-turn requests, each one of ``prompts`` system prompts (``prompt_tokens``,
    uniform) reused by many users, picked by Zipf popularity (exponent ``zipf_s``: a few prompts are hot,
    most are lukewarm), then a question of its own; Poisson arrivals over ``duration_s``."""
    rng = random.Random(seed + 2)
    systems = [_tokens(rng, rng.randrange(*prompt_tokens)) for _ in range(prompts)]
    weights = [1 / (k + 1) ** zipf_s for k in range(prompts)]
    w = Workload("prefix", [])
    for u in range(requests):
        w.system[u] = systems[rng.choices(range(prompts), weights)[0]]
        w.conversations.append([Turn(u, rng.uniform(0, duration_s), _tokens(rng, rng.randrange(*question_tokens)),
                                     rng.randrange(*output_tokens))])
    return w


def multiturn_workload(seed: int, *, users: int, turns: int, start_s: float, first_tokens: tuple[int, int],
                       user_tokens: tuple[int, int], output_tokens: tuple[int, int], think_s: float) -> Workload:
    """Multi-turn chat: ``users`` conversations that start over ``start_s`` and grow turn by turn (no
    shared system prompt): a first turn of ``first_tokens``, then ``turns - 1`` (±1) questions of
    ``user_tokens``, each prompt the whole conversation so far; think time exponential, mean ``think_s``."""
    rng = random.Random(seed + 3)
    w = Workload("multiturn", [])
    for u in range(users):
        w.system[u] = []
        n_turns = max(2, turns + rng.choice((-1, 0, 0, 1)))
        w.conversations.append([
            Turn(u, rng.uniform(0, start_s) if k == 0 else _think(rng, think_s),
                 _tokens(rng, rng.randrange(*(user_tokens if k else first_tokens))), rng.randrange(*output_tokens))
            for k in range(n_turns)])
    return w
