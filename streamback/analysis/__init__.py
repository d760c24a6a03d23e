"""The analyses of trained runs (rules in workflow/rules/analysis.smk, `streamback analyze <kind>`):
per-layer precision error and sign flips, residual envelopes, swallowed updates, loss differences.

Computation (`inputs`, `precision`, `envelope`, `loss`: tables as pandas DataFrames) is kept apart
from presentation (`figures`: Altair charts drawn from those tables), so the study page draws the
same charts from the same CSV files without recomputing anything; `stage` is the command.
"""
