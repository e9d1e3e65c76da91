"""What a search leaves in its folder, read back from the study: trials.csv (one row per
trial, with its reason when it did not complete), best.yml (the best trial's config, as its
run saved it: `loom train best.yml` trains that trial again) and importance.json."""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchloom.data.atomic_files import write_text_atomic
from torchloom.data.csv_cells import safe_mapping
from torchloom.errors import LoomError
from torchloom.search.record import SearchRecord
from torchloom.search.study import load_study

if TYPE_CHECKING:
    import optuna

# PED-ANOVA asks which parameters it takes to reach the best `target_quantile` of trials.
# Optuna's 0.1 keeps 20 of 200 trials, and misranks loss = 3x + 2y + z + 0w on one seed of
# three (y before x); 0.2 ranks it right on all three (docs/benchmarks.md, "Search").
PED_ANOVA_QUANTILE = 0.2


# trials.csv's columns besides the monitor's and the parameters': a parameter of one of these
# names (code-first builders name their own) would overwrite the column.
TRIAL_COLUMNS = ("number", "state", "reason", "retry_of", "duration_s", "run_dir")


# The user attribute of a trial with its values as sampled (a list choice a list, not the JSON
# text Optuna's params keep of it).
VALUES = "values"


def sampled_values(trial: Any) -> dict[str, Any]:
    """A trial's values as its config got them (its params for trials run before they were
    kept)."""
    kept = trial.user_attrs.get(VALUES)
    return dict(kept) if isinstance(kept, dict) else dict(trial.params)


@dataclass
class SearchResults:
    study: optuna.Study
    rows: list[dict[str, Any]]
    best: Any  # a FrozenTrial, or None when no trial completed
    importance: dict[str, float]
    importance_note: str


class SearchFailed(LoomError):
    headline = "search failed"


def check_some_trial_completed(search_dir: Path, results: SearchResults) -> None:
    """A search whose trials all failed has no result: `loom search` said "no trial
    completed" and exited 0. One that ran no trial (its time limit passed first) failed
    nothing, and a pruned trial is the pruner's verdict, not a failure: those end well. So
    does one whose study may still complete a trial: a retry queued (a trial whose process
    died or was stopped, its time limit then passed), another machine's trial running."""
    from optuna.trial import TrialState

    trials = results.study.trials
    pending = (TrialState.RUNNING, TrialState.WAITING, TrialState.PRUNED)
    if results.best is not None or any(t.state in pending for t in trials):
        return
    # A trial retried (its retry exists) is counted by its retry.
    failed = sum(t.state == TrialState.FAIL and not t.user_attrs.get("retried") for t in trials)
    if failed:
        raise SearchFailed.at(
            str(search_dir),
            "search",
            f"no trial completed: {failed} trial{'s' if failed != 1 else ''} failed",
            "each one's reason is in trials.csv and search.html; fix the config and start "
            "a new search, or, when the cause was passing, `loom search --resume` it with "
            "more --trials",
        )


def open_study(search_dir: Path, record: SearchRecord) -> optuna.Study:
    url = record.storage_url(search_dir)
    return load_study(url, record.study, None, None, record.study_identity())


def trial_rows(study: optuna.Study, record: SearchRecord) -> list[dict[str, Any]]:
    names = list(dict.fromkeys(p for t in study.trials for p in t.params))
    rows = []
    for trial in study.trials:
        duration = trial.duration.total_seconds() if trial.duration is not None else None
        row: dict[str, Any] = {"number": trial.number, "state": trial.state.name.lower()}
        row[record.monitor] = trial.value if trial.value is not None else ""
        row.update({name: _shown(trial.params.get(name, "")) for name in names})
        # A complete trial has no reason: one a reaper wrote before its worker told the
        # value first (the reaper then failed nothing) is not the trial's.
        complete = trial.state.name == "COMPLETE"
        row["reason"] = "" if complete else trial.user_attrs.get("reason", "")
        row["retry_of"] = trial.user_attrs.get("retry_of", "")
        row["duration_s"] = round(duration, 2) if duration is not None else ""
        row["run_dir"] = trial.user_attrs.get("run_dir", "")
        rows.append(row)
    return rows


def _shown(value: Any) -> Any:
    return value if not isinstance(value, float) else float(f"{value:.6g}")


def best_trial(study: optuna.Study) -> Any:
    from optuna.trial import TrialState

    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return None
    return study.best_trial


def import_result_modules() -> None:
    """Import what `write_results` and the page's plots need: `optuna.importance` imports
    scikit-learn for fANOVA even when PED-ANOVA is asked for (1.6 s), its matplotlib plots
    0.4 s. A `loom search` whose own worker has ended calls this while it waits for the
    others, rather than after them."""
    import matplotlib

    matplotlib.use("Agg")  # as the page draws: no window, whatever pyplot would pick
    import matplotlib.pyplot
    import optuna.importance
    import optuna.visualization.matplotlib  # noqa: F401


def make_evaluator(name: str) -> Any:
    import optuna

    if name == "fanova":
        return optuna.importance.FanovaImportanceEvaluator(seed=0)
    return optuna.importance.PedAnovaImportanceEvaluator(target_quantile=PED_ANOVA_QUANTILE)


def importance(study: optuna.Study, evaluator: str = "ped-anova") -> tuple[dict[str, float], str]:
    """Parameter importance over the completed trials ({} and why when it cannot be told)."""
    import warnings

    import optuna
    from optuna.trial import TrialState

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < 3:
        return {}, f"needs 3 completed trials or more ({len(complete)} so far)"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            values = optuna.importance.get_param_importances(
                study, evaluator=make_evaluator(evaluator)
            )
    except (RuntimeError, ValueError, ImportError) as error:
        return {}, f"{evaluator} could not tell: {error}"
    return {k: float(v) for k, v in values.items() if math.isfinite(v)}, evaluator


def write_results(search_dir: Path, record: SearchRecord) -> SearchResults:
    """trials.csv, best.yml and importance.json (ranked by the record's evaluator)."""
    evaluator = record.importance
    study = open_study(search_dir, record)
    rows = trial_rows(study, record)
    out = io.StringIO()
    if rows:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(safe_mapping(row) for row in rows)  # parameter values: user text
    write_text_atomic(search_dir / "trials.csv", out.getvalue())
    best = best_trial(study)
    if best is not None and best.user_attrs.get("config"):
        header = (
            f"# The best trial ({best.number}) of the search {search_dir}: "
            f"{record.monitor} = {best.value:.6g}.\n"
            "# `loom train best.yml` trains this config again (its seed included).\n"
        )
        write_text_atomic(search_dir / "best.yml", header + best.user_attrs["config"])
    scores, note = importance(study, evaluator)
    write_text_atomic(
        search_dir / "importance.json",
        json.dumps({"evaluator": evaluator, "importance": scores, "note": note}, indent=2) + "\n",
    )
    return SearchResults(study, rows, best, scores, note)
