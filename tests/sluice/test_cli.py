"""The ``sluice`` command line explains itself: every command listed with a summary, every option
with help, defaults and environment fallbacks shown, clear errors, a version."""

from __future__ import annotations

import argparse
from importlib.metadata import version

import pytest

from sluice import cli

COMMANDS = ["serve", "worker", "router", "bookkeeper", "flower", "start", "drain", "status", "prometheus-targets", "models", "keys",
            "usage", "db", "observe", "dashboard", "planner", "profile"]


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def every_parser(parser: argparse.ArgumentParser, path: str = "sluice") -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(path, parser)]
    for name, child in subcommands(parser).items():
        found += every_parser(child, f"{path} {name}")
    return found


def test_the_top_level_help_lists_every_command_with_a_summary(capsys: pytest.CaptureFixture[str]) -> None:
    parser = cli.build_parser()
    assert list(subcommands(parser)) == COMMANDS
    with pytest.raises(SystemExit) as exited:
        cli.main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    summaries = {a.dest: a.help for a in parser._subparsers._group_actions[0]._choices_actions}
    for name in COMMANDS:
        assert summaries[name] and " ".join(summaries[name].split()) in " ".join(out.split()), name
    assert "``" not in out and "SLUICE_" in out


def test_every_option_of_every_command_has_help() -> None:
    for path, parser in every_parser(cli.build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help, f"{path} {action.option_strings or action.dest} has no help"


@pytest.mark.parametrize(("argv", "expected"), [
    (["serve"], ["SLUICE_FRONTEND__HOST; default 127.0.0.1", "SLUICE_PORT or SLUICE_FRONTEND__PORT; default 8000",
                 "(default: info)"]),
    (["router"], ["SLUICE_ROUTER__HOST; default 127.0.0.1", "SLUICE_ROUTER__PORT; default 8001"]),
    (["worker"], ["SLUICE_WORKER__WORKER_ID"]),
    (["flower"], ["(default: 5555)", "(default: 127.0.0.1)"]),
    (["db", "upgrade"], ["(default: head)"]),
])
def test_defaults_and_environment_fallbacks_are_shown(argv: list[str], expected: list[str],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main([*argv, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for text in expected:
        assert text in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"sluice {version('sluice')}"


@pytest.mark.parametrize("argv", [[], ["models"], ["keys"], ["db"]])
def test_a_missing_command_is_named_for_the_user(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "the following arguments are required: COMMAND" in err and "_cmd" not in err


def test_router_host_and_port_override_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    import router.service

    seen = []
    monkeypatch.setattr(router.service, "run", seen.append)
    monkeypatch.setenv("SLUICE_ROUTER__PORT", "9100")
    cli.get_settings.cache_clear()
    try:
        assert cli.main(["router", "--host", "0.0.0.0"]) == 0
        assert cli.main(["router", "--port", "9200"]) == 0
    finally:
        cli.get_settings.cache_clear()
    assert [(s.router.host, s.router.port) for s in seen] == [("0.0.0.0", 9100), ("127.0.0.1", 9200)]


def test_an_unknown_model_is_one_line_and_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["models", "prepare", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sluice models prepare: error: unknown model 'no-such-model'") and "Traceback" not in err
