"""Storage URLs and their passwords: one way to show a URL (`mask_url`), one way to keep it
(`without_password`), one way to connect with it (`with_password`).

A password never reaches the run directory, the database's copy of the config, or a printed line:
URLs are parsed with SQLAlchemy's `make_url` (a password may hold ``/``, ``?``, ``:``), shown with
the password as ``***``, and stored without it. At run time the password comes from
``MUTRANSFER_STORAGE_PASSWORD``, or, for PostgreSQL, from ``PGPASSWORD`` or ``~/.pgpass``, which the
driver (libpq) reads itself. This module imports no Optuna (the config reads it).
"""

from __future__ import annotations

import os
import re

__all__ = ["PASSWORD_ENV", "mask_url", "scrub", "with_password", "without_password"]

PASSWORD_ENV = "MUTRANSFER_STORAGE_PASSWORD"
_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.\-]*://)(?P<user>[^:/@]*)(:(?P<pw>.*))?@")
_QUERY_PASSWORD = re.compile(r"(?i)([?&]password=)[^&#]*")


def mask_url(url: str) -> str:
    """The URL with its password (``user:PASSWORD@`` and a ``?password=`` parameter) shown as ***,
    safe to print or store. Parsed with SQLAlchemy's `make_url`, so a password holding ``/``,
    ``?`` or ``:`` is hidden whole; a URL it cannot parse is masked from the last ``@`` back."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:  # not a SQLAlchemy URL: mask what looks like credentials
        return _QUERY_PASSWORD.sub(r"\1***", _CREDENTIALS.sub(_masked_credentials, url))
    if "password" in parsed.query:
        parsed = parsed.update_query_dict({"password": "***"})
    return parsed.render_as_string(hide_password=True).replace("password=%2A%2A%2A", "password=***")


def _masked_credentials(m: re.Match) -> str:
    return f"{m['scheme']}{m['user']}{':***' if m['pw'] is not None else ''}@"


def without_password(url: str) -> str:
    """The URL with no password at all (neither ``user:PASSWORD@`` nor ``?password=``): what the run
    directory and the database keep. At run time the password comes from the environment
    (`with_password`, ``PGPASSWORD``) or ``~/.pgpass``.

    Args:
        url: a storage URL.

    Returns:
        The URL without its password; `url` unchanged when it holds none or does not parse.
    """
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:
        return url
    if parsed.password is None and "password" not in parsed.query:
        return url
    parsed = parsed._replace(password=None).difference_update_query(["password"])  # set() skips None
    return parsed.render_as_string(hide_password=False)


def with_password(url: str) -> str:
    """`url` with the password from ``MUTRANSFER_STORAGE_PASSWORD`` when it holds none and the
    variable is set; unchanged otherwise (PostgreSQL's driver reads ``PGPASSWORD`` and ``~/.pgpass``
    itself).

    Args:
        url: a storage URL.

    Returns:
        The URL to connect with (never print it: use `mask_url`).
    """
    password = os.environ.get(PASSWORD_ENV)
    if not password or url.startswith("sqlite"):
        return url
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:
        return url
    if parsed.password is not None or "password" in parsed.query:
        return url
    return parsed.set(password=password).render_as_string(hide_password=False)


def _passwords(url: str) -> list[str]:
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:
        return []
    found = [parsed.password, parsed.query.get("password")]
    return [str(p) for p in found if isinstance(p, str) and p]


def scrub(text: str, url: str) -> str:
    """`text` (an error message) with every URL masked and the password of `url` (and of
    ``MUTRANSFER_STORAGE_PASSWORD``) replaced by ***, wherever it appears.

    Args:
        text: the text to print.
        url: the URL the text is about.

    Returns:
        The text, safe to print.
    """
    out = _QUERY_PASSWORD.sub(r"\1***", _CREDENTIALS.sub(_masked_credentials, text))
    secrets = _passwords(url) + ([os.environ[PASSWORD_ENV]] if os.environ.get(PASSWORD_ENV) else [])
    for secret in sorted(set(secrets), key=len, reverse=True):
        out = out.replace(secret, "***")
    return out
