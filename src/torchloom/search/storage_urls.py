"""The URLs of a search's storage as text: how they are shown (never with a password), what a
search folder records of them (the URL less its password), and the forms `--storage` takes.

A password may sit in a URL's user part (`postgresql://user:PW@host/db`) or in a query
parameter (`?password=PW`, which libpq reads too). A search folder and its page are what users
share, so the record keeps the URL without it: a resumed search is given it again by
`--storage`, or by the database client's own places (PGPASSWORD, ~/.pgpass for PostgreSQL).
"""

from __future__ import annotations

import importlib.util
import re
from typing import Any
from urllib.parse import unquote, urlsplit

from torchloom.errors import ConfigError

JOURNAL = "journal:"
GRPC = "grpc://"
GRPC_PORT = 13000  # Optuna's default
HIDDEN = "***"
# What `--storage` accepts, for the message that refuses another form.
ACCEPTED_FORMS = "sqlite:///FILE, postgresql://USER@HOST/DATABASE or another SQLAlchemy URL"
STORAGE_FORMS = f"{ACCEPTED_FORMS}, journal:FILE, grpc://HOST:PORT"


def hide_password(url: str) -> str:
    """`url` as every message and page shows it: each password replaced by ***."""
    return _replace_passwords(url, HIDDEN)


def without_password(url: str) -> str:
    """`url` as a search folder records it: no password in its user part or its query."""
    return _replace_passwords(url, None)


def has_password(url: str) -> bool:
    return without_password(url) != url


def hide_passwords_in(text: str, url: str) -> str:
    """`text` (a driver's message about `url`) with the URL's passwords replaced by ***
    where the driver quotes what it was given: the URL, its user part, a `password=`
    parameter or a quoted password. (Not every occurrence of the password's letters: a
    short one turned "translate" into "tr***nsl***te", which told the password.)"""
    text = text.replace(url, hide_password(url))
    for password in _passwords(url):
        for form in {password, unquote(password)}:
            for quoted in (f":{form}@", f"={form}", f"'{form}'", f'"{form}"'):
                hidden = quoted.replace(form, HIDDEN)
                text = text.replace(quoted, hidden)
    return text


# A URL's user part as SQLAlchemy reads it (its URL pattern): the password runs from the
# user's `:` to the first `@`, so it may hold `/` or `?`, which urlsplit would take for the path.
_USER_PART = re.compile(r"^(?P<user>[^:/]*):(?P<password>[^@]*)@")


def _split(url: str) -> tuple[str, str | None, str | None, str, list[str]] | None:
    """(scheme, user, password, host/port/database, query parameters) of a database URL;
    None for a journal, a gRPC address or no URL."""
    scheme, separator, rest = url.partition("://")
    if not separator or url.startswith((JOURNAL, GRPC)):
        return None
    user, password = None, None
    match = _USER_PART.match(rest)
    if match:
        user, password, rest = match["user"], match["password"], rest[match.end() :]
    location, question, query = rest.partition("?")
    return scheme, user, password, location, query.split("&") if question else []


def _passwords(url: str) -> list[str]:
    split = _split(url)
    if split is None:
        return []
    _, _, password, _, parameters = split
    found = [password or ""]
    for parameter in parameters:
        key, equals, value = parameter.partition("=")
        if equals and _is_password_key(key):
            found.append(value)
    return [password for password in found if password]


def _replace_passwords(url: str, replacement: str | None) -> str:
    """`url` with each password replaced (None: removed, with its `:` or its parameter)."""
    split = _split(url)
    if split is None or not _passwords(url):
        return url
    scheme, user, password, location, parameters = split
    kept = ""
    if password is not None:
        kept = f"{user}:{replacement}@" if replacement is not None else (f"{user}@" if user else "")
    items = []
    for parameter in parameters:
        key, equals, _ = parameter.partition("=")
        if equals and _is_password_key(key):
            if replacement is None:
                continue
            parameter = f"{key}={replacement}"
        items.append(parameter)
    return f"{scheme}://{kept}{location}" + ("?" + "&".join(items) if items else "")


def _is_password_key(key: str) -> bool:
    return unquote(key).strip().lower() == "password"


# A database's port when its URL names none, by SQLAlchemy's backend name.
DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mariadb": 3306, "mssql": 1433}


def same_storage(given: str, recorded: str) -> bool:
    """Whether the URL `given` names the storage a search folder `recorded` (its URL without
    a password): the same backend, user, host, port and database, whether or not either
    names the driver or the default port, whatever their query options (sslmode, ...)."""
    return _identity(given) == _identity(recorded)


def _identity(url: str) -> tuple[Any, ...]:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parts = make_url(without_password(url))
    except (ArgumentError, ValueError):  # a journal, a gRPC address: the text names it
        return (url,)
    backend = parts.get_backend_name()
    port = parts.port or DEFAULT_PORTS.get(backend)
    return backend, parts.username, (parts.host or "").lower(), port, parts.database


def with_installed_driver(url: str) -> str:
    """A `postgresql://` URL, which names no driver, with the one installed: SQLAlchemy 2.1
    reads it as psycopg 3's, and torchloom installs psycopg2 (psycopg2-binary), so the URL
    every PostgreSQL guide writes failed with "needs a driver"."""
    scheme, separator, rest = url.partition("://")
    if scheme != "postgresql" or not separator:
        return url
    if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2"):
        return f"postgresql+psycopg2://{rest}"
    return url


def grpc_address(url: str) -> tuple[str, int]:
    """(host, port) of `grpc://HOST[:PORT]`; an IPv6 host keeps its brackets, which gRPC's
    `HOST:PORT` needs (`[::1]:13000`: "::1:13000" is no address)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError as error:
        raise ConfigError.at("--storage", url, f"has no valid port: {error}") from error
    if port == 0:  # was taken for no port, Optuna's default, without a word
        raise ConfigError.at("--storage", url, "has no valid port: 0", "e.g. grpc://db.lab:13000")
    if not parts.hostname or parts.path not in ("", "/"):
        raise ConfigError.at(
            "--storage", url, "must be grpc://HOST:PORT", "e.g. grpc://db.lab:13000"
        )
    return grpc_host(parts.hostname), port or GRPC_PORT


def grpc_host(host: str) -> str:
    """`host` as gRPC's `HOST:PORT` takes it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
