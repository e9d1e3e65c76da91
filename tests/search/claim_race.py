"""A worker's ask loop without the training, for the tests of the trial budget across
processes (test_search_budget.py): each process claims trials of one study and completes them
at once, its count of the study's trials slowed so that two processes count at the same
moment, as two machines do when one trial is left.

    python claim_race.py URL STUDY BUDGET FOLDER exact|locked|unlocked

`exact`: the search's ask lock around count and ask, which must cover every process (a
PostgreSQL advisory lock, a journal's file lock): no trial is ever handed back; `locked`: the
ask lock, whatever it covers (through a gRPC server, only this process's folder); `unlocked`:
no common lock, each process in its own folder, as machines whose database gives none
(claim_trial then hands a trial over the budget back). Prints how many trials it ran and
handed back."""

from __future__ import annotations

import contextlib
import random
import sys
import time
from pathlib import Path

from torchloom.search import claims
from torchloom.search import study as studies

COUNT_SECONDS = 0.2


def main() -> None:
    url, name, budget_text, folder, mode = sys.argv[1:]
    budget = int(budget_text)
    counted = claims.counted_trials

    def slow_count(study: object) -> int:
        number = counted(study)  # type: ignore[arg-type]
        time.sleep(COUNT_SECONDS)
        return number

    claims.counted_trials = slow_count  # claim_trial reads it from its module
    study = studies.load_study(url, name, None, None)
    ran = handed_back = 0
    while True:
        if mode in ("exact", "locked"):
            lock = claims.ask_lock(Path(folder), url, study)
        else:
            lock = contextlib.nullcontext(False)
        with lock as exact:
            if mode == "exact" and not exact:
                sys.exit(f"the ask lock does not cover every process of {url}")
            if counted(study) >= budget:
                break
            trial = claims.claim_trial(study, budget, exact)
        if trial is None:
            handed_back += 1
            time.sleep(random.uniform(0.05, 0.3))
            continue
        study.tell(trial, float(trial.number))
        ran += 1
    print(f"ran {ran}, handed back {handed_back}")


if __name__ == "__main__":
    main()
