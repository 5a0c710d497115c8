"""`yxanul bench --profile`: where one training step's time goes.

A few steps of the case run under torch.profiler. Written per case into --out:
``profile-<preset>-<seq>-<precision>.txt`` with the totals per step (wall, host, device), the top
CUDA kernels by self device time (what the GPU runs) and the top ops by self host time (what Python
and the dispatcher launch). The same numbers, per step, go into the bench row (``row["profile"]``), so
they are committed with the bench JSON. Host time above device time means the step is bound by the
launches (the host cannot keep the GPU fed), not by the kernels.

One more step runs with Python stacks (``with_stack``; apart, as the tracer slows the host) for the
**sites**: each op's own device time (CPU: own host time) grouped by where it was called from, the
innermost Python line outside torch (a TE or yxanul line; for a backward op of torch's own autograd, the
backward node), with its nn.Module and the kernel that took most of it. That says which line launches
e.g. a copy kernel, which the kernel table alone cannot. Where the tracer records no Python frame at all
(CPython 3.12.0-3.12.4, the GPU image's 3.12.3: pytorch/pytorch#155446), one step more runs with each module's
forward as a profiler range (:func:`module_ranges`): the sites then name the module (``forward of X``).
"""

from __future__ import annotations

import re
import time
from contextlib import contextmanager
from pathlib import Path

TOP_KERNELS = 20
TOP_HOST_OPS = 15
TOP_SITES = 20
PY_FRAME = re.compile(r"^(?P<file>\S+\.py)\((?P<line>\d+)\): (?P<func>.+)$")  # the python tracer's event names


def profile_steps(step, device, folder: Path, row: dict, steps: int = 3) -> dict:
    """Profile ``steps`` calls of ``step``; write the text report, return its per-step summary."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize(device)
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for i in range(steps):
            step(i)
        if cuda:
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - t0
    summary = summarize(prof.key_averages(), steps, wall)
    with profile(activities=acts, with_stack=True) as traced:
        step(steps)
        if cuda:
            torch.cuda.synchronize(device)
    events = traced.events()
    summary["python_stacks"] = any(PY_FRAME.match(e.name) for e in events)
    if not summary["python_stacks"]:  # the tracer recorded nothing: the modules from forward hooks instead
        with profile(activities=acts) as traced, module_ranges():
            step(steps + 1)
            if cuda:
                torch.cuda.synchronize(device)
        events = traced.events()
    summary["sites"] = sites(events, cuda)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"profile-{row['preset']}-{row['seq_length']}-{row['precision']}.txt"
    title = (f"{row['preset']} seq {row['seq_length']} micro {row['micro_batch']} {row['precision']}"
             + (f" ({row['variant']})" if row.get("variant") else "") + f", {steps} profiled steps")
    path.write_text(report(summary, title))
    return {"file": path.name, **summary}


def summarize(averages, steps: int, wall_s: float) -> dict:
    """Per-step milliseconds: wall, host (self CPU time of every op), device (self time of every kernel),
    and the top kernels / host ops with their share."""
    from torch.autograd import DeviceType

    kernels = [e for e in averages if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0]
    host_ops = [e for e in averages if e.device_type == DeviceType.CPU]
    host_us = sum(e.self_cpu_time_total for e in host_ops)
    device_us = sum(e.self_device_time_total for e in kernels)

    def top(events, attr, n, total):
        events = sorted(events, key=lambda e: getattr(e, attr), reverse=True)[:n]
        return [{"name": e.key, "calls_per_step": round(e.count / steps, 1),
                 "ms_per_step": round(getattr(e, attr) / 1e3 / steps, 3),
                 "pct": round(100 * getattr(e, attr) / total, 1) if total else None} for e in events]

    return {"steps": steps, "wall_ms_per_step": round(wall_s * 1e3 / steps, 2),
            "host_ms_per_step": round(host_us / 1e3 / steps, 2),
            "device_ms_per_step": round(device_us / 1e3 / steps, 2) if kernels else None,
            "kernels_per_step": round(sum(e.count for e in kernels) / steps, 1),
            "top_kernels": top(kernels, "self_device_time_total", TOP_KERNELS, device_us),
            "top_host_ops": top(host_ops, "self_cpu_time_total", TOP_HOST_OPS, host_us)}


@contextmanager
def module_ranges():
    """Every nn.Module's forward as a profiler range named as the Python tracer names it (``nn.Module: Cls``),
    through torch's global forward hooks: the sites' modules where the tracer records no Python frame."""
    from torch.autograd.profiler import record_function
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    ranges = []  # nested as the forwards are

    def enter(module, _args):
        ranges.append(record_function(f"nn.Module: {type(module).__name__}").__enter__())

    def leave(_module, _args, _out):
        if ranges:
            ranges.pop().__exit__(None, None, None)

    hooks = [register_module_forward_pre_hook(enter), register_module_forward_hook(leave)]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()
        while ranges:  # a forward that raised
            ranges.pop().__exit__(None, None, None)


def site_of(event) -> tuple[str, str | None]:
    """(where ``event`` was called from, its nn.Module class): the innermost Python line outside torch among its
    ancestors, else the autograd node whose backward ran it, else the forward of its innermost module, else its
    outermost ancestor's name."""
    site = module = None
    node, top = event.cpu_parent, event.name
    while node is not None:
        name = node.name
        if module is None and name.startswith("nn.Module: "):
            module = re.sub(r"_\d+$", "", name[len("nn.Module: "):])
        if site is None:
            m = PY_FRAME.match(name)
            if m and not m["file"].startswith(("torch/", "<")) and "/torch/" not in m["file"]:
                site = f"{_short(m['file'])}({m['line']}): {m['func']}"
            elif name.startswith("autograd::engine::evaluate_function: "):
                site = "backward of " + name.split(": ", 1)[1]
        top, node = name, node.cpu_parent
    return site or (f"forward of {module}" if module else top), module


def _short(path: str) -> str:
    """'/x/site-packages/transformer_engine/pytorch/linear.py' -> 'transformer_engine/pytorch/linear.py'."""
    for anchor in ("site-packages/", "dist-packages/"):
        if anchor in path:
            return path.split(anchor, 1)[1]
    m = re.search(r"(yxanul/.*)$", path)
    return m.group(1) if m else path


def sites(events, device: bool, n: int = TOP_SITES) -> list[dict]:
    """The top (op, site) pairs of one traced step by the op's own device time (``device``) or host time."""
    attr = "self_device_time_total" if device else "self_cpu_time_total"
    from torch.autograd import DeviceType

    groups: dict[tuple, dict] = {}
    for e in events:
        t = getattr(e, attr) if e.device_type == DeviceType.CPU and not PY_FRAME.match(e.name) else 0
        if t <= 0 or e.name.startswith(("nn.Module: ", "autograd::engine::", "<built-in")):
            continue
        site, module = site_of(e)
        g = groups.setdefault((e.name, site), {"op": e.name, "site": site, "module": module, "calls": 0, "us": 0.0,
                                               "kernels": {}})
        g["calls"] += 1
        g["us"] += t
        for k in getattr(e, "kernels", ()) if device else ():
            g["kernels"][k.name] = g["kernels"].get(k.name, 0) + k.duration
    total = sum(g["us"] for g in groups.values())
    out = []
    for g in sorted(groups.values(), key=lambda g: g["us"], reverse=True)[:n]:
        kernel = max(g["kernels"], key=g["kernels"].get) if g["kernels"] else None
        out.append({"op": g["op"], "site": g["site"], "module": g["module"], "kernel": kernel,
                    "calls_per_step": g["calls"], "ms_per_step": round(g["us"] / 1e3, 3),
                    "pct": round(100 * g["us"] / total, 1) if total else None})
    return out


def report(s: dict, title: str) -> str:
    """The text file: totals, then the two tables."""
    device = f"{s['device_ms_per_step']:.2f} ms" if s["device_ms_per_step"] is not None else "n/a (no CUDA)"
    bound = ""
    if s["device_ms_per_step"]:
        bound = ("  -> host-bound (launches)" if s["host_ms_per_step"] > s["device_ms_per_step"]
                 else "  -> device-bound (kernels)")
    lines = [title, "",
             (f"per step: wall {s['wall_ms_per_step']:.2f} ms | host (self CPU of all ops) "
              f"{s['host_ms_per_step']:.2f} ms | device (self time of all kernels) {device}"
              f" | {s['kernels_per_step']:.0f} kernels{bound}"), ""]
    for label, key in (("CUDA kernels by self device time", "top_kernels"),
                       ("host ops by self CPU time", "top_host_ops")):
        if not s[key]:
            lines += [f"no {label.split(' by ')[0]} recorded", ""]
            continue
        lines += [f"top {len(s[key])} {label}:", f"{'ms/step':>9} {'%':>6} {'calls/step':>10}  name"]
        lines += [f"{r['ms_per_step']:>9.3f} {r['pct'] if r['pct'] is not None else '':>6} "
                  f"{r['calls_per_step']:>10}  {r['name'][:140]}" for r in s[key]]
        lines.append("")
    if s.get("sites"):
        what = "device" if s["device_ms_per_step"] is not None else "host"
        how = "with Python stacks" if s.get("python_stacks", True) else "no Python stacks recorded: modules from hooks"
        lines += [f"top {len(s['sites'])} call sites by the op's own {what} time (one step, {how}):",
                  f"{'ms/step':>9} {'%':>6} {'calls':>6}  op @ site [module] (kernel)"]
        lines += [f"{r['ms_per_step']:>9.3f} {r['pct'] if r['pct'] is not None else '':>6} {r['calls_per_step']:>6}  "
                  f"{r['op']} @ {r['site']}" + (f" [{r['module']}]" if r["module"] else "")
                  + (f" ({r['kernel'][:80]})" if r["kernel"] else "") for r in s["sites"]]
        lines.append("")
    return "\n".join(lines)
