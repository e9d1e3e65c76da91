"""The arguments each `loom` command takes: one builder per command, and the table of
commands with the module that runs each (loaded on dispatch by cli/main.py). Only argparse
here, so that `loom --help` never imports torch."""

from __future__ import annotations

import argparse
from collections.abc import Callable

# subcommand -> (module under torchloom.cli, one-line help)
SUBCOMMANDS = {
    "check": ("check", "build a pipeline, run the handshake and print the pipeline table"),
    "config": ("config_cmd", "print the merged, resolved config as YAML"),
    "components": ("components", "list registered components, or describe one"),
    "train": ("train", "train a pipeline (offline or online); --resume continues a run"),
    "process": ("process", "one pass over a section in eval mode, with a run's weights"),
    "report": ("report", "write RUN_DIR/report.html (a search folder: search.html) about a run"),
    "runs": ("runs", "a table of the runs under an experiments folder, for model selection"),
    "compare": ("compare", "one HTML page comparing runs: statistics, curves, config changes"),
    "lr-find": ("lr_find", "learning-rate range test (Smith 2015): a plot and a suggested rate"),
    "search": ("search", "hyper-parameter search on Optuna: one training run per trial"),
    "search-server": (
        "search_server",
        "serve a search database over gRPC to many workers (--storage grpc://HOST:PORT)",
    ),
    "quantize": ("quantize", "int8 models of a run, measured against float (size, latency, stats)"),
    "export": (
        "export",
        "a run's tensor graph as ONNX (checked in ONNX Runtime), pt2 or safetensors",
    ),
    "predict": ("predict", "labels for images or texts from an ONNX export, in ONNX Runtime"),
}
OVERRIDES_HELP = "Hydra-style overrides: a.b=v, +a.b=v (add), ++a.b=v, ~a.b (delete)"


def _config_arguments(parser: argparse.ArgumentParser, optional: bool = False) -> None:
    parser.add_argument("config", nargs="?" if optional else None, help="pipeline config (YAML)")
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE", help=OVERRIDES_HELP)


def _names(text: str) -> list[str]:
    """A comma-separated option's names (components, layers, streams), blanks dropped; one
    that names nothing (`--disable ,`) is refused, not taken as no option."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r} names nothing: give comma-separated names")
    return names


def _disable(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--disable",
        type=_names,
        default=[],
        metavar="A,B",
        help="comma-separated components to leave out of the pipeline",
    )


def _check(p: argparse.ArgumentParser) -> None:
    _config_arguments(p)
    _disable(p)


def _config(p: argparse.ArgumentParser) -> None:
    _config_arguments(p)


def _components(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", help="a component type to describe")


def _train(p: argparse.ArgumentParser) -> None:
    _config_arguments(p, optional=True)
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last.pt")
    # None when not given: --resume continues the run's own folder, and refuses them.
    p.add_argument("--expdir", default=None, help="parent folder of run folders (default: runs)")
    p.add_argument("--tag", default=None, help="suffix of the run folder's name")
    p.add_argument(
        "--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)"
    )
    _disable(p)
    p.add_argument(
        "--tensorboard",
        type=int,
        choices=(0, 1, 2),
        default=1,
        help="0 off, 1 scalars, 2 scalars + weight/gradient histograms",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar or console log")
    scale = p.add_argument_group("several processes (torch.distributed, DDP)")
    scale.add_argument("--nproc", type=int, default=1, help="processes on this machine")
    scale.add_argument("--gpu", action="store_true", help="one process per visible GPU")
    scale.add_argument("--nnodes", type=int, default=1, help="machines taking part")
    scale.add_argument("--node-rank", type=int, default=0, help="this machine's rank (0..)")
    scale.add_argument(
        "--rdzv-endpoint", default=None, metavar="HOST:PORT", help="node 0's rendezvous address"
    )
    scale.add_argument(
        "--max-restarts", type=int, default=0, help="elastic restarts after a worker dies"
    )
    scale.add_argument(
        "--rdzv-timeout", type=int, default=120, help="seconds to wait for every machine"
    )


def _process(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "source",
        metavar="CONFIG|RUN_DIR",
        help="a config, or a run folder (of `loom train` or of torchloom.Trainer(...).fit)",
    )
    p.add_argument("overrides", nargs="*", metavar="OVERRIDE", help=OVERRIDES_HELP)
    p.add_argument("--section", default="test", help="training, validation or test")
    p.add_argument(
        "--checkpoint",
        default=None,
        metavar="best|last|PATH",
        help="weights to use (default: the run's best.pt)",
    )
    p.add_argument(
        "--checkpoint-strict",
        type=_boolean,
        default=True,
        metavar="true|false",
        help="false: load the weights that match and list the rest (default: every weight of "
        "the pipeline must be in the checkpoint)",
    )
    p.add_argument("--expdir", default="runs", help="parent of a new run folder (CONFIG)")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N")
    _disable(p)


def _boolean(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _report(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="a run folder (<expdir>/<pipeline>/<date>)"
    )


def _runs(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "expdir",
        nargs="?",
        default="runs",
        metavar="EXPDIR",
        help="experiments folder (default: runs)",
    )
    p.add_argument(
        "--sort",
        default=None,
        metavar="STAT",
        help="sort by a statistic, e.g. validation.accuracy or test.loss (its value "
        "at the best epoch; best first; runs without it last)",
    )
    p.add_argument("--limit", type=int, default=None, metavar="N", help="show the first N runs")
    direction = p.add_mutually_exclusive_group()
    direction.add_argument(
        "--ascending",
        dest="descending",
        action="store_false",
        default=None,
        help="lowest first (the default for losses and errors)",
    )
    direction.add_argument(
        "--descending",
        dest="descending",
        action="store_true",
        default=None,
        help="highest first (the default for other statistics)",
    )


def _compare(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="two or more run folders")
    p.add_argument(
        "-o",
        "--output",
        default="compare.html",
        metavar="OUT.html",
        help="the page to write (default: ./compare.html)",
    )
    p.add_argument("--force", action="store_true", help="overwrite OUT.html when it exists")


def _lr_find(p: argparse.ArgumentParser) -> None:
    _config_arguments(p)
    p.add_argument("--start-lr", type=float, default=1e-7, help="first learning rate")
    p.add_argument("--end-lr", type=float, default=10.0, help="last learning rate")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps of the ramp")
    p.add_argument("--expdir", default="runs", help="parent folder of run folders")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N")
    _disable(p)


def _search(p: argparse.ArgumentParser) -> None:
    _config_arguments(p, optional=True)
    p.add_argument(
        "--space", metavar="FILE", help="the search space (default: the config's `search:` section)"
    )
    p.add_argument(
        "--trials",
        type=int,
        default=None,
        metavar="N",
        help="trials the study should have in all (a resumed study counts its own)",
    )
    p.add_argument(
        "--sampler",
        default=None,
        metavar="NAME",
        help="tpe (default), random, grid, cmaes, nsga2, gp, qmc, evolution (regularized)",
    )
    p.add_argument(
        "--pruner",
        default=None,
        metavar="NAME",
        help="none (default), median, sha, hyperband; percentile and threshold take their "
        "arguments in the config's search section ({type: percentile, percentile: 25.0})",
    )
    p.add_argument(
        "--monitor",
        default=None,
        metavar="STAT",
        help="statistic to optimise (default: the early-stopping monitor)",
    )
    p.add_argument("--mode", default=None, choices=("min", "max"), help="minimise or maximise")
    p.add_argument(
        "--storage",
        default=None,
        metavar="URL",
        help="an SQLAlchemy URL such as postgresql://user@host/db, or grpc://HOST:PORT of a "
        "`loom search-server` (default: a journal file in the search folder)",
    )
    p.add_argument(
        "--study", default=None, metavar="NAME", help="study name (default: the pipeline's name)"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="K",
        help="processes on this machine sharing the study",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds after which no new trial starts",
    )
    p.add_argument("--seed", type=int, default=None, help="the sampler's seed")
    p.add_argument(
        "--importance",
        default=None,
        metavar="ped-anova|fanova",
        help="parameter importance evaluator (default: ped-anova, or what the search folder "
        "keeps; `loom report` ranks with it too)",
    )
    p.add_argument("--resume", metavar="SEARCH_DIR", help="continue a search folder's study")
    p.add_argument(
        "--expdir", default=None, help="parent of searches/<name>/<date> (default: runs)"
    )
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N")
    # A worker process `loom search --workers K` starts; it reads its search on stdin.
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)


def _search_server(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "storage",
        metavar="DATABASE_URL",
        help="the SQLAlchemy URL of the studies' database, e.g. postgresql://user@db/studies",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: all)")
    p.add_argument("--port", type=int, default=13000, help="port to listen on (default: 13000)")


def _quantize(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder of `loom train`")
    p.add_argument("--mode", default="static", help="dynamic, static or qat (default: static)")
    p.add_argument("--backend", default="x86", help="x86, onednn or qnnpack (default: x86)")
    batches = "static: training batches (default: 16)"
    p.add_argument("--calibration-batches", type=int, metavar="N", help=batches)
    weights = p.add_mutually_exclusive_group()
    weights.add_argument(
        "--per-channel",
        dest="per_channel",
        action="store_true",
        default=True,
        help="one scale per output channel (default)",
    )
    weights.add_argument("--per-tensor", dest="per_channel", action="store_false")
    p.add_argument(
        "--skip", type=_names, default=[], metavar="LAYER,...", help="layers kept in float"
    )
    p.add_argument("--checkpoint", default=None, metavar="best|last|PATH")
    p.add_argument("--force", action="store_true", help="replace an earlier result of the mode")
    p.add_argument("--repeats", type=int, default=30, help="timed runs per latency figure")
    epochs = "qat: fine-tuning epochs (default: 1)"
    p.add_argument("--qat-epochs", type=int, metavar="E", help=epochs)
    p.add_argument(
        "--qat-lr",
        type=float,
        default=None,
        metavar="LR",
        help="qat: fine-tuning rate (default: the run's rate x 0.1)",
    )
    p.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        metavar="QAT_RUN",
        help="qat: continue the latest fine-tuning run stopped before its end (or QAT_RUN), "
        "with the options it was started with",
    )


def _export(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder of `loom train`")
    p.add_argument("--format", default="onnx", help="onnx, pt2 or safetensors (default: onnx)")
    p.add_argument(
        "--outputs", type=_names, default=[], metavar="STREAM,...", help="streams to output"
    )
    p.add_argument(
        "--inputs",
        type=_names,
        default=[],
        metavar="STREAM,...",
        help="streams to start from (default: the task's), after python-side components",
    )
    p.add_argument("--repeats", type=int, default=30, help="timed runs per latency figure")
    p.add_argument("--opset", type=int, default=None, metavar="N", help="ONNX opset version")
    p.add_argument(
        "--int8", action="store_true", help="onnx: also model_int8.onnx (ONNX Runtime QDQ)"
    )
    p.add_argument(
        "--aoti", action="store_true", help="pt2: also an AOTInductor package (C++ compiler)"
    )
    batch = p.add_mutually_exclusive_group()
    batch.add_argument(
        "--dynamic-batch",
        dest="dynamic_batch",
        action="store_true",
        default=True,
        help="any batch size (default)",
    )
    batch.add_argument(
        "--static-batch",
        dest="dynamic_batch",
        action="store_false",
        help="batch size fixed to 1",
    )
    p.add_argument("--checkpoint", default=None, metavar="best|last|PATH")
    p.add_argument("--force", action="store_true", help="replace an earlier export")


def _predict(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "export_dir", metavar="EXPORT_DIR", help="RUN_DIR/exports/onnx, or RUN_DIR itself"
    )
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="image files (PNG, JPEG); for a text export, text files or texts",
    )
    p.add_argument("--top", type=int, default=1, metavar="K", help="labels shown per input")
    p.add_argument("--json", action="store_true", help="print JSON lines")


ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "check": _check,
    "config": _config,
    "components": _components,
    "train": _train,
    "process": _process,
    "report": _report,
    "runs": _runs,
    "compare": _compare,
    "lr-find": _lr_find,
    "search": _search,
    "search-server": _search_server,
    "quantize": _quantize,
    "export": _export,
    "predict": _predict,
}
