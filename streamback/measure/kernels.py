"""Where a training step spends its time, kernel by kernel, and what Inductor generated for it.

- `generated_kernels(fn)`: calls `fn` (which compiles) with Inductor's output code captured: per
  compiled graph, its kernels in launch order with, for Triton kernels, the bytes Inductor's own
  estimate says each moves (`kernel_num_gb`). Per-block torch.compile compiles one forward and one
  backward graph that every block runs, so these are the kernels of one block. On the CPU the
  kernels are C++ (the scheduler fuses at the same level, so their count is a proxy for the GPU's).
- `kernel_times(step, steps, device)`: torch.profiler over `steps` calls of `step`: per kernel
  name, milliseconds and launches per step (CUDA kernels on a GPU; on the CPU each operator's
  self time), with the step's wall time, so that wall - busy is the time the GPU waited.
- `kind(name)` groups kernels: Triton pointwise (`triton:poi`), persistent and looped reductions
  (`triton:per`, `triton:red`), C++ (`cpp`), `matmul`, `attention`, `fill`, `other`.
- `by_kind`, `kind_table`, `top_differences`: the comparison of two variants' profiles;
  `top_kernels`: one profile's most expensive kernels.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict

import torch

_KERNEL = re.compile(r"^(\w+) = async_compile\.(?:triton|cpp_pybinding|cpp)\(.*?'''(.*?)'''", re.M | re.S)
_EXTERN = re.compile(r"\bextern_kernels\.(\w+)\(")
_GB = re.compile(r"'kernel_num_gb': ([0-9.e+-]+)")


def generated_kernels(fn) -> tuple[object, list[dict]]:
    """(fn's result, one dict per compiled graph in compile order: `kernels` [(name, MB or None)],
    `extern` [names of library calls such as mm]). Compiles afresh (dynamo reset, caches off)."""
    import torch._inductor.config as inductor_config
    from torch._inductor.utils import run_and_get_code

    with inductor_config.patch(force_disable_caches=True, benchmark_kernel=True):
        result, codes = run_and_get_code(fn)
    graphs = []
    for code in codes:
        kernels = []
        for name, source in _KERNEL.findall(code):
            gb = _GB.search(source)
            kernels.append((name, float(gb.group(1)) * 1e3 if gb else None))
        call = code[code.find("def call(") :]
        graphs.append({"kernels": kernels, "extern": _EXTERN.findall(call)})
    return result, graphs


def kind(name: str) -> str:
    n = name.lower()
    if n.startswith("triton_"):
        return "triton:" + n.split("_")[1]
    if n.startswith("cpp_"):
        return "cpp"
    if any(k in n for k in ("gemm", "cutlass", "nvjet", "sm90_xmma", "aten::mm", "aten::addmm", "aten::bmm")):
        return "matmul"
    if any(k in n for k in ("flash", "fmha", "attention", "sdpa")):
        return "attention"
    if "fill" in n or n in ("aten::zeros", "aten::zero_"):
        return "fill"
    return "other"


def kernel_times(step, steps: int, device: torch.device) -> dict:
    """Profile `steps` calls of `step` (warm up first): {"kernels": {name: [ms per step, launches
    per step]}, "busy_ms": summed kernel time per step, "wall_ms": median wall time of a step}."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    walls = []
    with profile(activities=activities) as prof:
        for _ in range(steps):
            if cuda:
                torch.cuda.synchronize(device)
            began = time.perf_counter()
            step()
            if cuda:
                torch.cuda.synchronize(device)
            walls.append(1e3 * (time.perf_counter() - began))
    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    if cuda:
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                kernels[event.name][0] += event.device_time_total / 1e3 / steps
                kernels[event.name][1] += 1 / steps
    else:
        for event in prof.key_averages():
            if event.self_cpu_time_total > 0:
                kernels[event.key] = [event.self_cpu_time_total / 1e3 / steps, event.count / steps]
    return {
        "kernels": dict(kernels),
        "busy_ms": sum(ms for ms, _ in kernels.values()),
        "wall_ms": sorted(walls)[len(walls) // 2],
    }


def by_kind(kernels: dict) -> dict[str, list[float]]:
    """{kind: [ms per step, launches per step]}."""
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for name, (ms, launches) in kernels.items():
        out[kind(name)][0] += ms
        out[kind(name)][1] += launches
    return dict(out)


def kind_table(a: dict, b: dict) -> list[list]:
    """Rows [kind, ms a, ms b, diff ms, launches a, launches b] of two `kernel_times` results, by
    the size of the difference, then the totals and the wall time."""
    ka, kb = by_kind(a["kernels"]), by_kind(b["kernels"])
    rows = []
    for k in sorted(set(ka) | set(kb), key=lambda k: -abs(kb.get(k, [0, 0])[0] - ka.get(k, [0, 0])[0])):
        (ma, la), (mb, lb) = ka.get(k, [0.0, 0.0]), kb.get(k, [0.0, 0.0])
        rows.append([k, f"{ma:.2f}", f"{mb:.2f}", f"{mb - ma:+.2f}", f"{la:.0f}", f"{lb:.0f}"])
    rows.append(
        [
            "busy (sum of kernels)",
            f"{a['busy_ms']:.2f}",
            f"{b['busy_ms']:.2f}",
            f"{b['busy_ms'] - a['busy_ms']:+.2f}",
            "",
            "",
        ]
    )
    rows.append(
        ["step wall time", f"{a['wall_ms']:.2f}", f"{b['wall_ms']:.2f}", f"{b['wall_ms'] - a['wall_ms']:+.2f}", "", ""]
    )
    return rows


def top_differences(a: dict, b: dict, count: int = 8) -> list[str]:
    """The `count` kernels whose time per step differs most: '+1.23 ms  40->0  name'."""
    ka, kb = a["kernels"], b["kernels"]
    names = sorted(set(ka) | set(kb), key=lambda n: -abs(kb.get(n, [0, 0])[0] - ka.get(n, [0, 0])[0]))[:count]
    lines = []
    for n in names:
        (ma, la), (mb, lb) = ka.get(n, [0.0, 0.0]), kb.get(n, [0.0, 0.0])
        lines.append(f"{mb - ma:+7.2f} ms  {la:.0f}->{lb:.0f}  {n[:100]}")
    return lines


def top_kernels(profile: dict, count: int = 10) -> list[str]:
    """The `count` kernels of one `kernel_times` result that take longest: '12.34 ms  40  name'."""
    ranked = sorted(profile["kernels"].items(), key=lambda item: -item[1][0])[:count]
    return [f"{ms:7.2f} ms  {launches:4.0f}  {name[:100]}" for name, (ms, launches) in ranked]


def graph_summary(graph: dict) -> str:
    """'14 kernels (triton:per 2, triton:poi 10, triton:red 2), 1,024 MB; 7 library calls'."""
    kinds: dict[str, int] = defaultdict(int)
    for name, _ in graph["kernels"]:
        kinds[kind(name)] += 1
    sizes = [mb for _, mb in graph["kernels"] if mb is not None]
    text = f"{len(graph['kernels'])} kernels ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})"
    if sizes:
        text += f", {sum(sizes):,.0f} MB"
    return text + f"; {len(graph['extern'])} library calls"
