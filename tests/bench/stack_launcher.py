"""A launcher the way benchmarks write one, for tests/bench/test_devstack.py: a private Redis and a
stack of one mocker worker and a frontend, with no ``try``/``finally`` of its own, so only the
devstack's exit hooks can clean up after it.

    python -m tests.bench.stack_launcher MODEL_DIR --then {wait,raise,return}

Once the stack is ready it prints one JSON line (``{"dirs": [...]}``: the temporary directories it
made) and waits for a line on stdin (a signal may end it there); then it raises or returns.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import uuid
from pathlib import Path

from bench.devstack import RedisServer, Stack


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="a tokenizer-only model directory")
    parser.add_argument("--then", choices=["raise", "return"], default="return",
                        help="how the launcher ends once a line arrives on stdin")
    args = parser.parse_args()
    # As a launcher started from a terminal: Ctrl-C raises KeyboardInterrupt even when the test
    # runner runs with SIGINT ignored (a background job of a non-interactive shell), which its
    # children would otherwise inherit.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    redis = RedisServer().start()
    stack = Stack(redis_url=redis.url, namespace=f"launch{uuid.uuid4().hex[:8]}", model_path=args.model_dir)
    stack.start_worker("w1")
    stack.start_frontend()
    stack.wait_ready("smollm2", workers=1)
    print(json.dumps({"dirs": [str(redis.workdir), str(stack.workdir)]}), flush=True)
    sys.stdin.readline()
    if args.then == "raise":
        raise RuntimeError("the launcher failed on purpose")


if __name__ == "__main__":
    main()
