"""imagegen-plot: training curves of one or more runs from their metrics.jsonl (see conf/plot.yaml)."""
from .cli import hydra_entry
from ..config import PlotConfig, typed
from ..plots import default_out, training_curves


def task(c, device):
    c = typed(PlotConfig, c)
    runs = [c.runs] if isinstance(c.runs, str) else list(c.runs or [])   # runs=DIR or runs=[A,B]
    training_curves(runs, c.out or (default_out(runs) if runs else None), log=c.log, overwrite=c.overwrite)


main = hydra_entry("plot", task)

if __name__ == "__main__":
    main()
