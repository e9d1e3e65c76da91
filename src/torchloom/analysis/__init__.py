"""Analysis of training runs: reports, plots, worst samples, layer statistics (engine hooks),
and the run reports of `loom report`, `loom runs`, `loom compare`."""
