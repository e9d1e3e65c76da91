"""`loom search-server DATABASE_URL`: Optuna's gRPC storage proxy in front of a database, for
studies of many workers: each worker keeps one gRPC channel to this server instead of a
database connection of its own (`loom search ... --storage grpc://HOST:PORT`).

The server holds the database's connections and Optuna's cache of the study; the workers
reach the study only through it. On SQLite, which locks no row, it makes the trials' state
changes one at a time, so a queued trial goes to one worker only (served_storage.py).
Optuna's proxy does not serve a journal file (optuna#6084) and gives no heartbeats, so a
worker's trial on a machine that dies stays running until a worker on that machine fails it
(docs/search.md, "Thousands of workers: a gRPC server")."""

from __future__ import annotations

from torchloom.errors import ConfigError
from torchloom.search.storage_urls import ACCEPTED_FORMS, GRPC, grpc_host, hide_password
from torchloom.search.study import open_storage


def serve(url: str, host: str, port: int) -> int:
    """Serve the database `url` on host:port until Ctrl-C or SIGTERM; returns 0."""
    if url.startswith(("journal:", GRPC)):
        raise ConfigError.at(
            "command line",
            url,
            "cannot be served: Optuna's gRPC proxy serves a database (an SQLAlchemy URL)",
            "e.g. loom search-server postgresql://user@db/studies, or sqlite:///studies.db",
        )
    from optuna.storages._grpc.server import make_server

    from torchloom.search.served_storage import served_storage

    # Optuna's cached storage in front of the database, as its proxy server recommends; on
    # SQLite, which locks no row, its trials' state changes one at a time (served_storage.py).
    if not 0 < port < 65536:  # -1 or 0 "served" on an address no worker could reach
        raise ConfigError.at("command line", "--port", f"must be from 1 to 65535, got {port}")
    storage = served_storage(open_storage(url, "DATABASE_URL", ACCEPTED_FORMS))
    # `--host ::1` could not listen, and `--host '[::1]'` printed an address its workers
    # could not use: gRPC's HOST:PORT and a worker's grpc:// URL take IPv6 in brackets.
    host = grpc_host(host)
    try:
        server = make_server(storage, host, port)
        server.start()
    except RuntimeError as error:  # the port is taken, or the host is not this machine's
        raise ConfigError.at(
            "command line", f"{host}:{port}", f"cannot listen there: {error}"
        ) from error
    print(f"search server: {hide_password(url)} on {GRPC}{host}:{port}", flush=True)
    print(f"workers: loom search CONFIG --storage {GRPC}{host}:{port}; Ctrl-C stops", flush=True)
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        print("search server: stopped", flush=True)
    finally:
        server.stop(grace=5).wait()
    return 0
