"""The preflight stage: a few steps of a run's own training, on its own resources, checked before
the run may train (`streamback preflight`, rule `preflight`; `checks` judges, `probe` measures,
`stage` is the subcommand, `table` the matrix's summary)."""
