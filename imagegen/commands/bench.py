"""imagegen-bench: speed benchmarks that print markdown tables and write JSON (options: config.BenchConfig).

mode=attention   causal attention forward / forward+backward time and peak memory
mode=train_step  whole-model training step, softmax vs linear
mode=sampling    images/sec of linear-recurrent, softmax-KV-cache, softmax- and LSH-recompute
mode=compare     the paper's table for trained checkpoints
mode=browser     the exported page's JavaScript step in headless Chromium beside Python's step
mode=paper       the paper's comparison: train every attention alike, then bits/dim and speed (docs/paper.md)
mode=speedrun    a recipe's CPU time to a validation target, into the record table (docs/speedrun.md)
mode=probes      the cached speed verdicts of the `auto` settings, each with why it is trusted or timed again
                 (probes.clear=true: remove them)
"""
from pathlib import Path

from .cli import hydra_entry
from ..config import BenchConfig, plain, typed
from ..data.sets import dataset_info
from ..errors import UserError

MODES = ("attention", "train_step", "sampling", "compare", "browser", "paper", "speedrun", "probes")


def probes(clear):
    """mode=probes: print the cached verdicts (tuning.probe.listing), or remove them (clear)."""
    from ..say import show
    from ..tuning import probe

    path = probe.cache_path()
    if clear:
        show(f"removed {probe.clear()} cached probe verdict(s) from {path}; each is timed again when next needed")
        return
    rows = probe.listing()
    if not rows:
        show(f"no cached probe verdicts in {path}")
        return
    show(f"{len(rows)} cached probe verdict(s) in {path} (ratio: baseline time / candidate time; the candidate is "
         f"chosen from its margin):", wrap=True)
    for key, e, why in rows:
        load = "?" if probe.others(e.get("load"), e.get("threads", 1)) is None else \
            f"{probe.others(e['load'], e.get('threads', 1)):.1f}"
        show(f"  {key.partition('/')[2]}: {e['baseline_ms'] / e['candidate_ms']:.2f}x, "
             f"{'chosen' if e.get('chosen') else 'not chosen'}, {e.get('threads', '?')} thread(s), timed "
             f"{e.get('when', '?')} with other load {load}; " + (f"timed again when next needed: {why}" if why
                                                                  else "trusted"))


def evaluator(c, device):
    """evaluate(path): imagegen-eval's result, at its defaults (config.EvalConfig), for a checkpoint on c's
    split (compare.split; the paper: test) and max_images."""
    from ..config import EvalConfig
    from .evaluate import evaluate

    def evaluated(path):
        eval_cfg = EvalConfig(checkpoint=str(path), split=c.compare.split if c.mode == "compare" else "test",
                              max_images=c.max_images, data=c.eval_data, overwrite=c.overwrite)
        return evaluate(plain(eval_cfg), device)
    return evaluated


def check_outputs(c, out):
    """Refuse, before anything is measured, a file in out_dir under the name of one this mode writes that imagegen
    did not write there (or that changed since), unless overwrite=true (files.check_owned)."""
    from ..benchmarks.report import outputs
    from ..files import check_owned

    data, arch = c.data.name, c.arch_name
    names = {"sampling": [f"sampling-{data}-{arch}"], "browser": [f"browser-{data}-{arch}"], "compare": ["compare"],
             "attention": ["attention"], "train_step": ["train_step"], "paper": [f"paper-{data}"]}.get(c.mode, [])
    plots = {"sampling": [f"sampling-{data}-{arch}-latency.png"], "paper": [f"paper-{data}.png"]}.get(c.mode, [])
    check_owned([p for name in names for p in outputs(out, name)] + [out / p for p in plots], "table", c.overwrite)


def task(c, device):
    c = typed(BenchConfig, c)
    if c.mode == "probes":
        return probes(c.probes.clear)
    from ..benchmarks.progress import apply_quick
    c = apply_quick(c)                     # quick=true: about a minute on 2 cores
    out = Path(c.out_dir)
    check_outputs(c, out)
    info = dataset_info(plain(c.data))
    from ..benchmarks import report
    if c.mode == "sampling":
        from ..benchmarks import sampling
        if device.type != "cpu":
            raise UserError("mode=sampling runs on the CPU in this version; use device=cpu.")
        name = f"sampling-{c.data.name}-{c.arch_name}"
        result = sampling.run(c, c.model, info, out_dir=out, out_name=name)     # rows written as they come
        md = sampling.report(result, c, c.arch_name, info, c.model)
        report.write_outputs(out, name, {"partial": False, "config": plain(c), "machine": report.machine(), **result},
                             md)
        sampling.plot_latency(out / f"{name}-latency.png", result, c.sampling.plot_batch,
                              log=c.sampling.plot_log,
                              title=f"Per-step latency, {c.arch_name} architecture, {info.length} sub-pixels")
    elif c.mode == "browser":
        from ..benchmarks import browser
        result = browser.run(c, c.model, info)
        md = browser.report(result, c, c.arch_name, info, c.model)
        report.write_outputs(out, f"browser-{c.data.name}-{c.arch_name}",
                             {"config": plain(c), "machine": report.machine(), **result}, md)
    elif c.mode == "compare":
        from ..benchmarks import compare
        result, md = compare.run(c, evaluator(c, device))
        report.write_outputs(out, "compare", {"machine": report.machine(), **result}, md)
    elif c.mode == "paper":
        from ..benchmarks import paper
        paper.run(c, evaluator(c, device))             # writes paper-<data>.json, .md and .png in out_dir
    elif c.mode == "speedrun":
        from ..benchmarks import speedrun
        speedrun.run(c)
    elif c.mode in ("attention", "train_step"):
        from ..benchmarks import attention
        run = attention.run_attention if c.mode == "attention" else attention.run_train_step
        result, md = run(c, device, out_dir=out)             # rows written to out as they are measured
        payload = {"partial": False, "config": plain(c), "machine": report.machine(), **result}
        report.write_outputs(out, c.mode, payload, md)
    else:
        raise UserError(f"unknown mode {c.mode!r}; choose one of {', '.join(MODES)}.")


main = hydra_entry("bench", task)

if __name__ == "__main__":
    main()
