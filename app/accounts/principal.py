"""Who is calling: what authentication hands to admission and to the handlers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated API key and what it may do.

    ``models`` None means every model; ``rpm`` / ``tpm`` None means no limit on that rate.
    """

    key_id: str
    name: str
    is_admin: bool = False
    models: frozenset[str] | None = None
    rpm: int | None = None
    tpm: int | None = None

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models
