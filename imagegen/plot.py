"""imagegen-plot: training curves of one or more runs from their metrics.jsonl (see conf/plot.yaml)."""
from .cli import hydra_entry
from .plots import default_out, training_curves


def task(c, device):
    runs = [c["runs"]] if isinstance(c["runs"], str) else list(c["runs"] or [])   # runs=DIR or runs=[A,B]
    training_curves(runs, c["out"] or (default_out(runs) if runs else None), log=c["log"])


main = hydra_entry("plot", task, description="training curves (bits/dim against steps and minutes) of one or more "
                                             "runs, from their metrics.jsonl, as one PNG.",
                   examples=["imagegen-plot runs=[checkpoints/mnist-linear-small,checkpoints/mnist-softmax-small]",
                             "imagegen-plot runs=checkpoints/mnist-linear-small out=curves.png log=true"])

if __name__ == "__main__":
    main()
