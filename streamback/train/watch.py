"""Early warnings of a long run, read from its metrics records as they are written (the drift
note's "watch the residual and gate maxima over time, not only the loss").

`Watch.observe(record)` returns the warnings of that step, each an event
`{"warning", "step", "layer", "value", "threshold", "message"}`; the trainer prints each message in
the run's log and keeps the events in the step's record (`warnings` in metrics.jsonl). The kinds,
each with its key in `train.log.warnings` (null turns it off):
- `swallowed`: a layer whose share of swallowed updates (`swallowed_fraction`) passes
  `swallowed_fraction`;
- `spacing`: a layer boundary whose grid step at the stream's max (`stream_spacing`) passes
  `spacing_share` times the typical update of the layer that writes it (`update_mean_abs`); one
  event a step names every layer that began to hold as ranges (`layer`: the layer, or "3-40, 42")
- `gain_rise`: a norm whose max |gain| rose steadily (`steady_rise`) by more than `gain_rise`
  over the last `trend_window` steps;
- `grad_norm_rise`: the gradient norm rose steadily by more than `grad_norm_rise` over the last
  `trend_window` steps while the loss moved by at most `loss_flat` of itself;
- `loss_spike`: a loss above the median of the previous `spike_window` steps by more than
  `loss_spike` of it.
The trend tests look only at steps after the warmup. A warning fires when its condition begins to
hold (a trend or spike warning then stays quiet for its window), so a run that stays in trouble is
named once, not at every step. Only deterministic fields are read, so replaying the records up to
a checkpoint (`replay`) puts a resumed run's watch where the uninterrupted run's was.
"""

from __future__ import annotations

import collections
import math

import numpy as np

SEGMENTS = 4  # a steady rise: the median of each quarter of the window above the one before
# each warning's threshold key in train.log.warnings
_KEYS = {
    "swallowed": "swallowed_fraction",
    "spacing": "spacing_share",
    "gain_rise": "gain_rise",
    "grad_norm_rise": "grad_norm_rise",
    "loss_spike": "loss_spike",
}


def steady_rise(values) -> float | None:
    """The rise of `values` (in time order) from the median of their first quarter to that of their
    last, relative to the first, if each quarter's median is above the one before; else None."""
    if len(values) < SEGMENTS:
        return None
    medians = [float(np.median(part)) for part in np.array_split(np.asarray(values, dtype=float), SEGMENTS)]
    if medians[0] <= 0 or any(b <= a for a, b in zip(medians, medians[1:])):
        return None
    return medians[-1] / medians[0] - 1


def relative_change(values) -> float:
    """|median of the last quarter / median of the first - 1|."""
    parts = np.array_split(np.asarray(values, dtype=float), SEGMENTS)
    first, last = float(np.median(parts[0])), float(np.median(parts[-1]))
    return abs(last / first - 1) if first else math.inf


class Watch:
    """The warnings of one run: `observe` each record in step order (`replay` those before a resume)."""

    def __init__(self, thresholds: dict, warmup_steps: int, stream: str):
        self.cfg, self.warmup, self.stream = thresholds, warmup_steps, stream
        window = max(thresholds["trend_window"], thresholds["spike_window"])
        self.steps = collections.deque(maxlen=window + 1)  # (step, loss, grad_norm)
        self.gains = collections.deque()  # (step, {norm: max |gain|}) within the trend window
        self.holding: set = set()  # (kind, layer) whose condition held at its last test
        self.fired: dict = {}  # (kind, layer) -> step it last fired

    def replay(self, records) -> None:
        for record in records:
            self.observe(record)

    def observe(self, record: dict) -> list[dict]:
        step, events = record["step"], []
        self.steps.append((step, record["loss"], record["grad_norm"]))
        if "swallowed_fraction" in record:
            events += self._stream(record)
        if "norm_gain_absmax" in record:
            self.gains.append((step, record["norm_gain_absmax"]))
            while self.gains[0][0] <= step - self.cfg["trend_window"]:
                self.gains.popleft()
            events += self._gains(step)
        events += self._grad_norm(step) + self._spike(step, record["loss"])
        return events

    def _event(self, kind, step, layer, value, holds, message, quiet=0) -> list[dict]:
        """The warning if its condition `holds` now and did not at its last test (and it is not within `quiet` steps of
        its last)."""
        threshold = self.cfg[_KEYS[kind]]
        if not self._holds((kind, layer), step, holds, quiet):
            return []
        where = f", {layer if isinstance(layer, str) else f'layer {layer}'}" if layer is not None else ""
        return [
            {
                "warning": kind,
                "step": step,
                "layer": layer,
                "value": value,
                "threshold": threshold,
                "message": f"warning (step {step}{where}): {message} (train.log.warnings.{_KEYS[kind]}: {threshold:g})",
            }
        ]

    def _stream(self, record) -> list[dict]:
        events, step = [], record["step"]
        share, ratio = self.cfg["swallowed_fraction"], self.cfg["spacing_share"]
        for layer, swallowed in enumerate(record["swallowed_fraction"]):
            if share is not None:
                events += self._event(
                    "swallowed",
                    step,
                    layer,
                    swallowed,
                    swallowed > share,
                    f"the {self.stream} stream's rounding swallowed {swallowed:.1%} of the layer's updates",
                )
        if ratio is not None:
            events += self._spacing(record, ratio)
        return events

    def _spacing(self, record, ratio) -> list[dict]:
        """One event for the step, naming as ranges the layers whose condition began to hold: a deep
        stream's grid step passes many layers' typical updates at once (the drift note's signal), and
        a line per layer would bury the log."""
        step, fired = record["step"], []
        for layer, update in enumerate(record["update_mean_abs"]):
            spacing = record["stream_spacing"][layer + 1]
            holds = update > 0 and spacing > ratio * update
            if self._holds(("spacing", layer), step, holds):
                fired.append((layer, spacing, record["stream_absmax"][layer + 1], update))
        if not fired:
            return []
        layers = [f[0] for f in fired]
        value = max(s / u for _, s, _, u in fired)
        where, what = (
            (f"layer {layers[0]}", "this layer")
            if len(fired) == 1
            else (f"layers {layer_ranges(layers)}", f"each of these {len(fired)} layers")
        )
        tops, steps, updates = ([f[i] for f in fired] for i in (2, 1, 3))
        return [
            {
                "warning": "spacing",
                "step": step,
                "layer": layers[0] if len(fired) == 1 else layer_ranges(layers),
                "value": value,
                "threshold": ratio,
                "message": f"warning (step {step}, {where}): at the stream's max |h| {_span(tops, '.4g')} after "
                f"{what} the {self.stream} grid step is {_span(steps, '.3g')}, up to {value:.3g} x the layer's "
                f"typical update {_span(updates, '.3g')} (train.log.warnings.spacing_share: {ratio:g})",
            }
        ]

    def _holds(self, key, step, holds: bool, quiet: int = 0) -> bool:
        """Record whether `key`'s condition holds at `step`; True if it fires: it holds now, did not at
        its last test, and `key` is not within `quiet` steps of its last firing."""
        held = key in self.holding
        (self.holding.add if holds else self.holding.discard)(key)
        if not holds or held or step - self.fired.get(key, -math.inf) <= quiet:
            return False
        self.fired[key] = step
        return True

    def _trend_window(self, step, series):
        """The values of `series` ((step, value) pairs) in the trend window after the warmup; None before it
        is covered."""
        start = step - self.cfg["trend_window"]
        if start < self.warmup:
            return None
        return [v for s, v in series if s > start]

    def _gains(self, step) -> list[dict]:
        rise_limit, events = self.cfg["gain_rise"], []
        if rise_limit is None:
            return []
        for norm in self.gains[-1][1]:
            values = self._trend_window(step, [(s, gains[norm]) for s, gains in self.gains if norm in gains])
            rise = steady_rise(values) if values is not None else None
            events += self._event(
                "gain_rise",
                step,
                norm,
                rise,
                rise is not None and rise > rise_limit,
                f"the norm's max |gain| rose steadily by {rise if rise is not None else 0:.1%} over the last "
                f"{self.cfg['trend_window']} steps, to {self.gains[-1][1][norm]:.4g}",
                quiet=self.cfg["trend_window"],
            )
        return events

    def _grad_norm(self, step) -> list[dict]:
        rise_limit = self.cfg["grad_norm_rise"]
        if rise_limit is None:
            return []
        norms = self._trend_window(step, [(s, g) for s, _, g in self.steps])
        rise = steady_rise(norms) if norms is not None and len(norms) == self.cfg["trend_window"] else None
        flat = (
            rise is not None
            and relative_change([loss for s, loss, _ in self.steps if s > step - self.cfg["trend_window"]])
            <= self.cfg["loss_flat"]
        )
        return self._event(
            "grad_norm_rise",
            step,
            None,
            rise,
            rise is not None and rise > rise_limit and flat,
            f"the gradient norm rose steadily by {rise or 0:.1%} over the last {self.cfg['trend_window']} steps, "
            f"to {norms[-1] if norms else 0:.4g}, while the loss stayed within {self.cfg['loss_flat']:.1%}",
            quiet=self.cfg["trend_window"],
        )

    def _spike(self, step, loss) -> list[dict]:
        limit, window = self.cfg["loss_spike"], self.cfg["spike_window"]
        before = [value for s, value, _ in self.steps if step - window <= s < step]
        if limit is None or len(before) < window:
            return []
        median = float(np.median(before))
        jump = loss / median - 1 if median > 0 else 0.0
        return self._event(
            "loss_spike",
            step,
            None,
            jump,
            jump > limit,
            f"the loss {loss:.4f} is {jump:.1%} above the median {median:.4f} of the previous {window} steps",
            quiet=window,
        )


def layer_ranges(layers: list[int]) -> str:
    """Sorted layer numbers as ranges: [0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    runs: list[list[int]] = []
    for layer in sorted(layers):
        if runs and layer == runs[-1][1] + 1:
            runs[-1][1] = layer
        else:
            runs.append([layer, layer])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _span(values, fmt: str) -> str:
    low, high = min(values), max(values)
    return f"{low:{fmt}}" if f"{low:{fmt}}" == f"{high:{fmt}}" else f"{low:{fmt}} to {high:{fmt}}"


WARNING_COLUMNS = ["run", "step", "warning", "layer", "value", "threshold", "message"]


def warnings_table(records_by_run: dict[str, list[dict]]):
    """Every warning that fired, one row per event (columns: WARNING_COLUMNS), in run and step order."""
    import pandas as pd

    rows = [
        [run, *(event[k] for k in WARNING_COLUMNS[1:])]
        for run, records in records_by_run.items()
        for r in records
        for event in r.get("warnings", [])
    ]
    return pd.DataFrame(rows, columns=WARNING_COLUMNS, dtype=object)  # a layer is a number, a norm's name or none
