"""`loom predict EXPORT_DIR INPUT... [--top K] [--json]`: predicted labels with probabilities,
from an ONNX export in ONNX Runtime, for image files or texts (see torchloom/deploy/predict.py)."""

from __future__ import annotations

import argparse
import json

from torchloom.deploy.predict import predict


def run(args: argparse.Namespace) -> int:
    for result in predict(args.export_dir, list(args.inputs), top=args.top):
        if args.json:
            top = [{"label": label, "probability": p} for label, p in result.top]
            print(json.dumps({"input": result.source, "top": top}))
        else:
            shown = ", ".join(f"{label} ({p:.3f})" for label, p in result.top)
            print(f"{result.source}: {shown}")
    return 0
