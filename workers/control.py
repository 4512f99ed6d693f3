"""A worker's control channel: commands from frontends and operators (core.messages.ControlCommand) on
the worker's own channel and the broadcast one, acted on on the engine loop's thread.

``cancel`` aborts a running request or is remembered for one not started yet; ``drain`` takes the
worker out of routing (workers.host); ``kv_release`` frees KV held for a decode worker; ``clear_kv``
drops the engine's unused cached blocks; ``load_lora``/``unload_lora`` change the adapters and answer
on the command's reply list. One subscription per connection; a lost connection is resubscribed after
a pause that grows while Redis stays away (core.loops.BackgroundLoop), so it cannot spin the loop.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

import msgspec
import redis.asyncio as aioredis

from core.errors import SluiceError
from core.keys import Keys
from core.loops import BackgroundLoop, Backoff
from core.messages import ControlCommand, LoraAck, decode_control
from router.registry import WorkerIdentity
from workers.engines.base import Engine
from workers.running import RunningRequests

log = logging.getLogger(__name__)


class ControlChannel:
    def __init__(self, redis: aioredis.Redis, keys: Keys, identity: WorkerIdentity, engine: Engine,
                 running: RunningRequests, *, drain: Callable[[], Awaitable[None]],
                 publish_load: Callable[[], Awaitable[None]], forget_guesses: Callable[[], Awaitable[None]]) -> None:
        """``drain``: take the worker out of routing; ``publish_load``: publish its load record now;
        ``forget_guesses``: drop the routers' guesses of its cache (a no-op for an engine with KV events)."""
        self.redis = redis
        self.keys = keys
        self.identity = identity
        self.engine = engine
        self.running = running
        self.drain = drain
        self.publish_load = publish_load
        self.forget_guesses = forget_guesses
        self._loop = BackgroundLoop("control-channel", self._session, backoff=Backoff(first_s=0.2, max_s=1.0))

    def start(self) -> None:
        self._loop.start()
        self._loop.wake()

    async def stop(self) -> None:
        await self._loop.stop()

    async def _session(self) -> None:
        """One connection's life on the control channels: subscribe, then act on commands until the
        connection fails. The BackgroundLoop running it pauses (growing while Redis stays away)
        before the next session, so a dead connection cannot spin the engine's event loop."""
        pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(self.keys.control_channel(self.identity.worker_id), self.keys.control_broadcast)
            self._loop.reset_backoff()
            while True:
                message = await pubsub.get_message(timeout=None)
                if message is not None and message["type"] == "message":
                    await self.handle(decode_control(message["data"]))
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()

    async def handle(self, cmd: ControlCommand) -> None:
        if cmd.op == "cancel" and cmd.request_id:
            if cmd.request_id in self.running.tasks:
                await self.engine.abort(cmd.request_id)
            else:
                self.running.remember_cancel(cmd.request_id)
        elif cmd.op == "drain":
            await self.drain()
        elif cmd.op == "kv_release" and cmd.request_id:
            await self.engine.release_transfer(cmd.request_id)
        elif cmd.op == "clear_kv":
            try:
                await self.engine.clear_kv_cache()  # reports AllBlocksCleared: the relay clears the index
            except SluiceError as exc:  # the engine failed; the control channel stays up
                log.error("clearing the KV cache failed: %s", exc.message)
            await self.forget_guesses()  # the routers' guesses, where the engine publishes no KV events
        elif cmd.op in ("load_lora", "unload_lora") and cmd.lora_name:
            await self._lora(cmd)

    async def _lora(self, cmd: ControlCommand) -> None:
        """Load or drop an adapter, publish the new list in the load record at once (routers then
        send the adapter's requests here), and answer on the command's reply list."""
        name = cmd.lora_name or ""
        try:
            if cmd.op == "load_lora":
                await self.engine.load_lora(name, cmd.lora_path or "")
            else:
                await self.engine.unload_lora(name)
            ack = LoraAck(self.identity.worker_id, ok=True)
            log.info("LoRA adapter %s %s", name, "loaded" if cmd.op == "load_lora" else "unloaded")
        except SluiceError as exc:
            ack = LoraAck(self.identity.worker_id, ok=False, error=exc.message, code=exc.code or "")
        except Exception as exc:  # noqa: BLE001 - the engine's fault, reported to the caller
            log.exception("LoRA adapter %s: %s failed", name, cmd.op)
            ack = LoraAck(self.identity.worker_id, ok=False, error=f"{type(exc).__name__}: {exc}")
        if ack.ok:
            await self.publish_load()
        if cmd.reply_key:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.rpush(cmd.reply_key, msgspec.json.encode(ack))
                pipe.expire(cmd.reply_key, 300)
                await pipe.execute()
