"""What verifying a model file costs: the rate of `weights.content_sha256` (the sha256 that
`save_model` records and `read_model` checks), beside torch.save and torch.load of the same
record, and what it comes to for the study's ~1B shapes (fp32 weights, Llama 3's vocabulary).

    python benchmarks/bench_model_hash.py                 # a 256 MB record, 3 repeats
    python benchmarks/bench_model_hash.py --megabytes 1024 --repeat 5

Times are the median of `--repeat` runs; the file is written to --dir (default: a temporary
directory), so its speed is that disk's (or page cache's).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import yaml

from streamback.model.model import ModelArgs, Transformer, count_params
from streamback.model.weights import content_sha256

ROOT = Path(__file__).resolve().parent.parent
LLAMA3_VOCAB = 128256


def median_seconds(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def paper_params() -> dict[str, int]:
    """Parameters of each shape of config/paper.yaml (built on the meta device)."""
    model = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())["model"]
    from streamback.config import validate_config

    model = validate_config({"model": model})["model"]
    counts = {}
    for shape in model["shapes"]:
        with torch.device("meta"):
            counts[shape] = count_params(Transformer(ModelArgs.from_config(model, shape, LLAMA3_VOCAB)))
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=256, help="size of the fp32 record timed")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--dir", type=Path, default=None, help="where the record is written (default: a temporary directory)"
    )
    args = parser.parse_args()

    torch.manual_seed(0)
    chunk = 1 << 22  # 4M fp32 values = 16 MB per tensor, like a layer's matrices
    n = max(1, args.megabytes * (1 << 20) // (4 * chunk))
    record = {"model_args": {"n": n}, "model": {f"w{k}": torch.randn(chunk) for k in range(n)}}
    size = 4 * chunk * n
    hashing = median_seconds(lambda: content_sha256(record), args.repeat)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "model.pt"
        saving = median_seconds(lambda: torch.save(record, path), args.repeat)
        loading = median_seconds(lambda: torch.load(path, weights_only=True), args.repeat)
    rate = size / hashing
    print(
        f"record of {size / 1e9:.3f} GB, torch {torch.__version__}, {torch.get_num_threads()} threads, median of "
        f"{args.repeat}"
    )
    print(
        f"content_sha256: {hashing:.3f} s = {rate / 1e9:.2f} GB/s; torch.save {saving:.3f} s "
        f"({size / saving / 1e9:.2f} GB/s); "
        f"torch.load {loading:.3f} s ({size / loading / 1e9:.2f} GB/s)"
    )
    print("what hashing adds to save_model and read_model of the paper's models (fp32):")
    for shape, params in paper_params().items():
        print(f"  {shape}: {params / 1e9:.3f} B parameters, {4 * params / 1e9:.2f} GB: {4 * params / rate:.1f} s")


if __name__ == "__main__":
    main()
