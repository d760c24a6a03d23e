"""The byte counter of benchmarks/stream_traffic.py (`streamback.measure.traffic`) on hand-computed cases, and the
script's table."""

import torch

from streamback.measure.traffic import Traffic


def test_bytes_counted_by_hand():
    a, b = torch.ones(1000), torch.ones(1000, dtype=torch.bfloat16)
    cases = [
        (lambda: a + a, 3 * 4000, 1000),  # read two fp32, write one
        (lambda: a + b, 4000 + 2000 + 4000, 1000),  # mixed add: bf16 read as it is, fp32 written
        (lambda: b.float(), 2000 + 4000, 1000),  # a conversion reads and writes
        (lambda: a.float(), 0, 0),  # already fp32: returns the input itself
        (lambda: a.view(10, 100).t(), 0, 0),  # views move nothing
        (lambda: a.clone().add_(1), 2 * 4000 + 2 * 4000, 2000),  # a copy, then an in-place read + write
        (lambda: a.sum(), 4000 + 4, 1000),  # a reduction: one operation per element read
    ]
    for fn, expected, elements in cases:
        counter = Traffic()
        with counter:
            fn()
        assert (counter.bytes, counter.elements) == (expected, elements), (fn, counter.bytes, expected)
