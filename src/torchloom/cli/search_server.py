"""`loom search-server DATABASE_URL --host H --port P`: a search database served over gRPC
(torchloom/search/server.py); workers give `--storage grpc://H:P`."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from torchloom.search.server import serve

    return serve(args.storage, args.host, args.port)
