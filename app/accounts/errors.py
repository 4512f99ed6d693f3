"""The accounts service's own errors, beside core.errors (the frontend's one handler maps any
SluiceError by its ``status_code``, ``type`` and ``code``)."""

from __future__ import annotations

from core.errors import SluiceError


class KeyNotFound(SluiceError):
    status_code = 404
    type = "invalid_request_error"
    code = "key_not_found"


class AccountsUnavailable(SluiceError):
    """The accounts database cannot be reached and no cached answer can stand in for it."""

    status_code = 503
    type = "service_unavailable"
    code = "accounts_unavailable"
