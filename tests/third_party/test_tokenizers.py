"""tokenizers: ``ModelCard.encode`` (app/model_card.py) calls ``Tokenizer.encode_batch`` for one
text because it releases the GIL while it works, which ``encode`` does not promise (and, in the
versions checked, does not do): the frontend tokenizes long prompts in a worker thread, and a
tokenizer holding the GIL would stall the event loop for the whole call all the same."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from tokenizers import Tokenizer

from tests.third_party.guard import drift, installed

LIBRARY = installed("tokenizers")
WHERE = "app/model_card.py (ModelCard.encode)"


def longest_stall(work: Callable[[], object]) -> tuple[float, float]:
    """Run ``work`` while another thread ticks; the longest gap between ticks, and ``work``'s time."""
    stop = threading.Event()
    ticks: list[float] = []

    def tick() -> None:
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    ticker = threading.Thread(target=tick)
    ticker.start()
    time.sleep(0.05)
    t0 = time.perf_counter()
    work()
    took = time.perf_counter() - t0
    stop.set()
    ticker.join()
    during = [t for t in ticks if t >= t0 - 0.01]
    return max(b - a for a, b in zip(during, during[1:], strict=False)), took


def test_encode_batch_releases_the_gil(tokenizer_dir) -> None:  # noqa: ANN001
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    text = "x " * 200_000
    stall, took = longest_stall(lambda: tokenizer.encode_batch([text], add_special_tokens=False))
    assert stall < took / 2, drift(LIBRARY, f"encode_batch held the GIL ({stall:.3f} s of {took:.3f} s without "
                                            "another thread running)", WHERE, "which tokenizers call releases the GIL")
    assert tokenizer.encode_batch([text])[0].ids == tokenizer.encode(text).ids
