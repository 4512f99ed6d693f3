"""The ``sluice`` command line: each subcommand starts one process or runs one job.

    sluice serve                  the OpenAI-compatible frontend (SLUICE_PORT, default 8000)
    sluice worker [--name N]      one Celery worker hosting one engine (SLUICE_ENGINE=mocker|vllm)
    sluice router                 the standalone routing service (POST /best_worker)
    sluice flower                 Celery's Flower dashboard (port 5555)
    sluice models prepare NAME    make a model directory from its packaged weights (default: smollm2)

Every option has an environment fallback with the ``SLUICE_`` prefix (see core/settings.py).
"""

from __future__ import annotations

import argparse
import os
import sys

from core.settings import get_settings


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    settings = get_settings()
    uvicorn.run("app.main:create_app", factory=True, host=args.host or settings.frontend.host,
                port=args.port or settings.frontend.port, log_level=args.log_level, access_log=False,
                loop="uvloop", http="httptools", timeout_graceful_shutdown=5)
    return 0


def _worker(args: argparse.Namespace) -> int:
    settings = get_settings()
    if args.name:
        os.environ.setdefault("SLUICE_WORKER__WORKER_ID", args.name)
        get_settings.cache_clear()
        settings = get_settings()
    engine_seqs = settings.worker.mocker.max_num_seqs if settings.worker.engine == "mocker" \
        else settings.worker.vllm.max_num_seqs
    concurrency = settings.worker.concurrency or engine_seqs
    from workers.celery_app import app

    argv = ["worker", "--pool", "threads", "-c", str(concurrency), "-l", args.log_level,
            "--without-gossip", "--without-mingle"]
    if settings.worker.task_events:
        argv.append("-E")
    if settings.worker.worker_id:
        argv += ["-n", f"{settings.worker.worker_id}@%h"]
    app.worker_main(argv)
    return 0


def _router(args: argparse.Namespace) -> int:
    from router.service import run

    run(get_settings())
    return 0


def _bookkeeper(args: argparse.Namespace) -> int:
    from workers.bookkeeping import main as run_bookkeeper

    run_bookkeeper(["--loglevel", args.log_level])
    return 0


def _flower(args: argparse.Namespace) -> int:
    from workers.celery_app import app

    os.environ.setdefault("FLOWER_UNAUTHENTICATED_API", "true")
    app.start(["flower", f"--port={args.port}", f"--address={args.address}"])
    return 0


def _models_prepare(args: argparse.Namespace) -> int:
    from workers.models.prepare import prepare_model

    settings = get_settings()
    weights = args.weights if args.weights is not None else settings.worker.engine != "mocker"
    path = prepare_model(args.name, settings.models_dir, weights=weights)
    print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluice", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the OpenAI-compatible frontend")
    p.add_argument("--host", default=None, help="bind address (env SLUICE_FRONTEND__HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (env SLUICE_PORT, default 8000)")
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=_serve)

    p = sub.add_parser("worker", help="run one engine worker (Celery)")
    p.add_argument("--name", default=None, help="worker id (env SLUICE_WORKER__WORKER_ID, default Celery's node name)")
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=_worker)

    p = sub.add_parser("router", help="run the standalone routing service")
    p.set_defaults(func=_router)

    p = sub.add_parser("bookkeeper", help="run the bookkeeper (writes usage records to the database)")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=_bookkeeper)
    p = sub.add_parser("flower", help="run Flower, Celery's dashboard")
    p.add_argument("--port", type=int, default=5555)
    p.add_argument("--address", default="127.0.0.1", help="bind address (0.0.0.0 in containers)")
    p.set_defaults(func=_flower)

    models = sub.add_parser("models", help="manage model directories").add_subparsers(dest="models_cmd", required=True)
    p = models.add_parser("prepare", help="prepare a packaged model (smollm2)")
    p.add_argument("name", nargs="?", default="smollm2")
    p.add_argument("--weights", action=argparse.BooleanOptionalAction, default=None,
                   help="also convert the weights (default: only for real engines)")
    p.set_defaults(func=_models_prepare)

    from sluice.accounts_cli import add_accounts_commands

    add_accounts_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
