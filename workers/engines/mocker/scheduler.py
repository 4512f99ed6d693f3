"""The mocker's scheduler: its queues, its KV cache, and the loop of steps (forward passes) it runs.

What it simulates, step by step, like vLLM's scheduler and Dynamo's mocker (``scheduler.rs``):

* one task runs steps while there is work. A step first gives every running request its next
  chunk (one token when decoding, a prefill chunk otherwise), oldest first, then admits waiting
  requests in arrival order while fewer than ``max_num_seqs`` run, the step's token budget
  (``max_num_batched_tokens``, long prompts are prefilled in chunks) is not spent and their
  blocks fit in the KV cache (:mod:`workers.engines.mocker.kv`);
* a request's leading full prompt blocks found in the prefix cache are not computed (its
  ``cached_tokens``), but the last prompt token always is, as in vLLM; a request whose prompt's
  KV was read from a prefill worker (:mod:`workers.engines.mocker.transfer`) starts past it;
* when a running request needs a block and none is free or evictable, the newest running
  request is preempted: its blocks are released and it waits again, first in line, to recompute
  its prompt and output (mostly from the prefix cache);
* each step lasts the time :mod:`workers.engines.mocker.timing` gives it (Dynamo's published
  model); the loop sleeps until the step's end and only then hands out the step's tokens, so
  time to first token includes the prefill. With ``no_sleep`` steps take no simulated time;
* tokens come from :mod:`workers.engines.mocker.tokens`, a hash of prompt, seed and position, or
  from the request's script (:mod:`workers.engines.mocker.script`).

The scheduler knows nothing of streams: it hands each step's :class:`StepStats` and tokens to
its owner, and a step that raises to the owner's fault handler, which is expected to fail the
requests and :meth:`Scheduler.reset` it; the loop then goes on.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

from core.messages import SamplingParams, TokenLogprob
from core.settings import MockerSettings
from router.hashing import block_hashes
from workers.engines.base import KvEventSink, StepStats, emit_kv_events
from workers.engines.mocker.kv import KvBlockManager
from workers.engines.mocker.request import Delivery, Request, RequestState
from workers.engines.mocker.timing import step_ms
from workers.engines.mocker.tokens import choose, finish_reason

log = logging.getLogger(__name__)

#: A step that starts this soon after the previous step's planned end is planned from that end,
#: so the loop's wake-up lateness does not add up over a run of busy steps; after a longer gap
#: (the engine was idle, or the host starved it) the plan restarts from now.
_CATCH_UP_S = 0.005

#: What the owner does with a step once its time has passed: report it, hand out its tokens.
StepDone = Callable[[StepStats, list[Delivery]], None]
#: What the owner does when a step raised: the queues and the cache can no longer be trusted.
StepFault = Callable[[Exception], None]


def _certain(token: int, sampling: SamplingParams) -> TokenLogprob | None:
    """A scripted token's logprobs: the script leaves no other choice."""
    return None if sampling.logprobs is None else TokenLogprob(0.0, [(token, 0.0)][:sampling.logprobs])


class Scheduler:
    """The waiting queue, the running set and the KV cache they share, and the steps over them.

    ``waiting`` is in admission order, a preempted request at its head; ``running`` is in
    admission order too, oldest first, so the newest is the one preempted. A request is in at
    most one of them, and only a running one holds blocks (see :class:`Request`).
    """

    def __init__(self, settings: MockerSettings, max_model_len: int,
                 on_export: Callable[[Request], None]) -> None:
        """``max_model_len``: the longest prompt + output a request may reach. ``on_export``: takes a
        finished ``export`` request whose blocks stay allocated for a decode worker's read (the
        transfer's hold), where any other finished request releases them."""
        self.settings = settings
        self.max_model_len = max_model_len
        self.kv = KvBlockManager(settings.kv_blocks, settings.block_size)
        self.waiting: deque[Request] = deque()
        self.running: dict[str, Request] = {}
        self._on_export = on_export
        self._wakeup = asyncio.Event()
        #: Running requests sent back to wait during the step being scheduled.
        self._preempted = 0

    # ---- the queues ---------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        """Queue a request for admission, behind those already waiting."""
        self.waiting.append(req)
        self._wakeup.set()

    def drop(self, req: Request) -> None:
        """Take a request out of the scheduler, releasing its blocks."""
        if req.state is RequestState.RUNNING:
            del self.running[req.request_id]
            self.release(req)
        elif req.state is RequestState.WAITING:
            self.waiting.remove(req)
        req.state = RequestState.DONE

    def release(self, req: Request) -> None:
        """Give back the blocks ``req`` holds (the cached ones stay cached, evictable once unused)."""
        self.kv.release(req.chain[: req.num_computed // self.settings.block_size], req.uncached)
        req.uncached = 0

    def reset(self) -> None:
        """Forget every request and start over with an empty KV cache (after a fault: the state cannot
        be trusted). The owner closes the requests' streams and reports the cache cleared."""
        self.waiting.clear()
        self.running.clear()
        self.kv = KvBlockManager(self.settings.kv_blocks, self.settings.block_size)

    def pending_prefill_tokens(self) -> int:
        """Prompt tokens admitted or waiting whose KV is not computed yet (cache hits of waiting requests
        not subtracted: they are known only at admission)."""
        running = sum(r.prompt_len - r.num_computed for r in self.running.values() if r.num_computed < r.prompt_len)
        return running + sum(len(r.tokens) - r.num_computed for r in self.waiting)

    # ---- the loop -----------------------------------------------------------------------------
    async def run(self, sink: KvEventSink, on_step: StepDone, on_fault: StepFault) -> None:
        """Run steps while there is work, each for its simulated time, until cancelled. A step's KV
        events go to ``sink`` as it is scheduled; its stats and tokens go to ``on_step`` at its end."""
        loop = asyncio.get_running_loop()
        planned_end = loop.time()
        while True:
            if not self.running and not self.waiting:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            start = loop.time()
            try:
                step, deliveries = self.step()
            except Exception as exc:  # noqa: BLE001 - fail the requests, keep the engine serving
                log.exception("mocker scheduler step failed")
                on_fault(exc)
                continue
            emit_kv_events(sink, self.kv.take_events())
            assert step.duration_s is not None
            if self.settings.no_sleep:
                await asyncio.sleep(0)
            else:
                base = planned_end if start - planned_end < _CATCH_UP_S else start
                planned_end = base + step.duration_s
                await asyncio.sleep(max(0.0, planned_end - loop.time()))
            on_step(step, deliveries)

    # ---- one step -----------------------------------------------------------------------------
    def step(self) -> tuple[StepStats, list[Delivery]]:
        """Schedule and compute one step; returns what it did (its simulated duration, also with
        ``no_sleep``) and the tokens it produced."""
        batch: list[tuple[Request, int]] = []
        self._preempted = 0
        # The decode part reads the KV usage as the step begins, before its own chunks take blocks:
        # what the running requests hold. Dynamo's mocker steps as if it did the same: only so do the
        # two step alike, to a few milliseconds, in ``python -m bench.dynamo_compare --parity``.
        kv_usage = self.kv.active_blocks / self.kv.num_blocks
        budget, preempted = self._schedule_running(batch, self.settings.max_num_batched_tokens)
        if not preempted:
            self._admit(batch, budget)
        prefill_tokens = decoding = 0
        for req, chunk in batch:
            if req.num_computed >= req.prompt_len and req.num_computed == len(req.tokens) - 1:
                decoding += 1
            else:
                prefill_tokens += chunk
        deliveries = [d for req, chunk in batch if (d := self._compute(req, chunk)) is not None]
        duration_s = step_ms(prefill_tokens, decoding, kv_usage, self.settings.speedup) / 1000.0
        return StepStats(duration_s, prefill_tokens, decoding, self._preempted, kv_usage), deliveries

    def _schedule_running(self, batch: list[tuple[Request, int]], budget: int) -> tuple[int, bool]:
        """Give running requests their next chunk, oldest first; returns the token budget left and
        whether a request was preempted (then nobody new is admitted this step, as in vLLM)."""
        waiting_before = len(self.waiting)
        for req in list(self.running.values()):
            if budget <= 0:
                break
            if req.state is not RequestState.RUNNING:  # preempted to make room for an older request
                continue
            chunk = min(len(req.tokens) - req.num_computed, budget)
            if self._reserve(req, chunk):
                budget -= chunk
                batch.append((req, chunk))
        return budget, len(self.waiting) > waiting_before

    def _admit(self, batch: list[tuple[Request, int]], budget: int) -> None:
        """Move waiting requests to running, in order, while they fit in this step."""
        s = self.settings
        bs = s.block_size
        while self.waiting and budget > 0 and len(self.running) < s.max_num_seqs:
            req = self.waiting[0]
            hit = min(self.kv.cached_prefix(req.chain), (len(req.tokens) - 1) // bs)
            # A pulled request holds the prefill worker's KV for its first ``remote_tokens`` tokens.
            computed = max(hit * bs, min(req.remote_tokens, len(req.tokens) - 1) if req.pulled else 0)
            chunk = min(len(req.tokens) - computed, budget)
            need = -(-(computed + chunk) // bs) - hit
            reused = req.chain[:hit]
            if not self.kv.can_allocate(need, reused):
                break
            self.waiting.popleft()
            self.kv.acquire(reused)
            self.kv.allocate(need)
            req.num_computed, req.uncached, req.state = hit * bs, need, RequestState.RUNNING
            if computed > hit * bs:  # the blocks read (from a prefill worker or a tier) enter the cache here
                self._register_full_blocks(req, hit, computed // bs)
                req.num_computed = computed
                if req.cached_tokens is None and not req.onboarded:
                    req.transferred_tokens = computed - hit * bs
            if req.cached_tokens is None:
                # Onboarded tokens count as cached, as vLLM counts a connector's external hits.
                req.cached_tokens = computed if req.onboarded else hit * bs
            self.running[req.request_id] = req
            budget -= chunk
            batch.append((req, chunk))

    def _compute(self, req: Request, chunk: int) -> Delivery | None:
        """Run ``chunk`` tokens of ``req``; once its KV has caught up, it samples the next token."""
        bs = self.settings.block_size
        before = req.num_computed // bs
        req.num_computed += chunk
        after = req.num_computed // bs
        if after > before:
            self._register_full_blocks(req, before, after)
        if req.num_computed < len(req.tokens):  # a prefill chunk short of the end
            return None
        position = len(req.tokens) - req.prompt_len
        script = req.script.ids if req.script is not None else ()
        if position < len(script):
            token, logprob = script[position], _certain(script[position], req.sampling)
        else:
            token, logprob = choose(req.key, position, req.sampling, self.settings.vocab_size,
                                    req.tokens, req.prompt_len)
        req.tokens.append(token)
        reason = finish_reason(token, len(req.tokens) - req.prompt_len, len(req.tokens), req.sampling,
                               self.max_model_len)
        if req.script is not None and position + 1 == len(script):
            if req.script.finish == "error":
                reason = "error"  # the script's engine fails the request here
            elif reason is None and not req.sampling.ignore_eos:
                reason = "stop"  # the script's end, as a model's end-of-sequence token
        if reason is not None:
            del self.running[req.request_id]
            if req.export:
                self._on_export(req)
            else:
                self.release(req)
            req.state = RequestState.DONE
        return Delivery(req, token, reason, logprob)

    # ---- KV blocks ----------------------------------------------------------------------------
    def _preempt(self, req: Request) -> None:
        """Send a running request back to the head of the queue; it recomputes from scratch."""
        self._preempted += 1
        del self.running[req.request_id]
        self.release(req)
        req.num_computed = 0
        req.pulled = False  # the read KV went with the blocks (what stays cached is a hit next time)
        req.state = RequestState.WAITING
        self.waiting.appendleft(req)

    def _reserve(self, req: Request, chunk: int) -> bool:
        """Allocate the blocks ``req``'s next ``chunk`` tokens need, preempting the newest running
        requests while the cache is short. False when ``req`` itself had to be preempted."""
        bs = self.settings.block_size
        held = req.num_computed // bs + req.uncached
        need = -(-(req.num_computed + chunk) // bs) - held
        while need > self.kv.available:
            victim = next(reversed(self.running.values()))
            self._preempt(victim)
            if victim is req:
                return False
        self.kv.allocate(need)
        req.uncached += need
        return True

    def _register_full_blocks(self, req: Request, start: int, end: int) -> None:
        """Blocks ``start..end-1`` of ``req`` just filled up: name them and put them in the cache."""
        bs = self.settings.block_size
        chain = req.chain
        known = len(chain)
        if known < end:  # blocks of generated tokens: continue the chain
            if known == 0:
                chain.extend(block_hashes(req.tokens[: end * bs], bs, req.root))
            else:
                chain.extend(block_hashes(
                    req.tokens[(known - 1) * bs : end * bs], bs, req.root, start_block=1, parent=chain[known - 1]))
        for i in range(start, end):
            self.kv.register(chain[i], chain[i - 1] if i else None)
        req.uncached -= end - start
