"""Hyper-parameter search on Optuna: spaces in YAML, one training run per trial, studies in
a journal file or a database, importance and a report page (docs/search.md)."""
