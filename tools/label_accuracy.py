"""Do a class-conditional model's samples show the class asked for? A judge (a classifier) labels
`--per-class` samples of every class at each guidance, its accuracy measured on the test set first;
the table gives the share recognised as the class asked for, per class and overall, and two measures
that see guidance overshoot, which the share alone rewards: the judge's mean confidence in the class
asked for, and the model's own bits/dim of its samples given their labels (near its test bits/dim at
guidance 1; streaks and speckles raise it).

    python -m tools.label_accuracy [--checkpoint mnist-linear] [--data-root DIR]
        [--guidance 1 2 3] [--per-class 100] [--epochs 4] [--threads N] [--judge FILE|small] [--out-dir bench]
        [--precision float32|int8|auto]

Writes bench/label_accuracy.{json,md}, both naming the judge and its test accuracy. The judge is not
part of imagegen. For CIFAR-10 and MNIST models it is by default the data set's shipped judge
(tools.judge's airbench-style CNNs: checkpoints/judges/cifar10, the colour judge, each image read with
its mirror image; checkpoints/judges/mnist, the digit judge, trained on all 60,000 training digits, never
mirrored). Otherwise, or with `--judge small`, it is a small CNN trained here on the model's
own training files: two 3x3 convolutions with max-pooling and a linear layer (the classic small MNIST
CNN, colour input for CIFAR-10), Adam, seeded, `--epochs`. `--judge FILE`: a judge written by
tools.judge (FILE.safetensors with its .json), or the small CNN's weights: read when
FILE exists, else trained and written there. --precision: the sampler's products (int8: 8-bit
weights; the samples' own bits/dim are always scored in float32, by the model as trained).
"""
import argparse
import time
from pathlib import Path

import torch
from torch import nn

from imagegen.store import checkpoint, shipped
from imagegen.data.sets import dataset_info, load_from_config
from imagegen.bits_per_dim import bits_per_dim
from imagegen.dtypes import dtype_name
from imagegen.model.transformer import model_dims
from imagegen.precision import decide_precision
from imagegen.sampling.decode import generate
from imagegen.benchmarks.report import machine, markdown_table, write_outputs
from imagegen.errors import UserError, one_line
from tools import judge as judges


def classifier(channels, classes, height, width):
    return nn.Sequential(nn.Conv2d(channels, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(64 * (height // 4) * (width // 4), classes))


def as_input(seqs, info):
    """(N, D) uint8 sequences -> (N, C, H, W) float in [0, 1] (the judge module's reading, at info's shape)."""
    return judges.as_images(seqs, info.height, info.width, info.channels)


def train_classifier(x, y, info, epochs, seed=0, batch=64):
    """A classifier trained on images x (N, D) uint8 with labels y (N,)."""
    torch.manual_seed(seed)
    net = classifier(info.channels, info.num_classes, info.height, info.width)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(epochs):
        for idx in torch.randperm(len(x)).split(batch):
            loss = nn.functional.cross_entropy(net(as_input(x[idx], info)), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return net.eval()


@torch.no_grad()
def class_probs(net, x, info):
    """The judge's class probabilities (N, classes) for images x (N, D) uint8."""
    return torch.cat([torch.softmax(net(as_input(part, info)), -1) for part in x.split(500)])


def load_judge(path, info):
    """The classifier whose weights `--judge` wrote to path (tensors only), in evaluation mode."""
    net = classifier(info.channels, info.num_classes, info.height, info.width)
    net.load_state_dict(torch.load(path, weights_only=True))
    return net.eval()


SMALL = "small"      # --judge small: train the small CNN even where a shipped judge exists


def small_judge(args, train, info):
    """The small CNN: read from --judge when that file exists, else trained (and saved there when --judge
    names a file)."""
    path = None if args.judge in (None, SMALL) else args.judge
    if path and Path(path).is_file():
        return load_judge(path, info), f"the small CNN read from {path}"
    net = train_classifier(*train, info, args.epochs, args.seed)
    if path:
        torch.save(net.state_dict(), path)
    return net, f"a small CNN trained on the {len(train[0])} training images, {args.epochs} epochs"


def pick_judge(judge_arg, data_name):
    """The judge file (tools.judge's .safetensors) label_accuracy reads for --judge judge_arg
    on a model of data set data_name, or None for the small CNN: a .safetensors named, else the shipped
    judge of the data set when --judge is not given and one ships."""
    if judge_arg == SMALL:
        return None
    if judge_arg is not None:
        return Path(judge_arg) if Path(judge_arg).suffix == ".safetensors" else None
    shipped_judge = judges.SHIPPED.get(data_name)
    return shipped_judge if shipped_judge is not None and shipped_judge.is_file() else None


def judge(args, train, info, data_name):
    """(probs, description): probs(seqs (N, D) uint8) -> the judge's class probabilities (N, classes)."""
    path = pick_judge(args.judge, data_name)
    if path is None:
        net, description = small_judge(args, train, info)
        return (lambda seqs: class_probs(net, seqs, info)), description
    net, meta = judges.load(path)
    shape = (net.info.height, net.info.width, net.info.channels, net.classes)
    if (info.height, info.width, info.channels, info.num_classes) != shape:
        raise UserError(f"the judge {path} reads {shape[0]}x{shape[1]}x{shape[2]} images of {shape[3]} classes, not "
                        f"this model's {info.height}x{info.width}x{info.channels} of {info.num_classes}; "
                        f"pass --judge small.")
    read = "each image read with its mirror" if net.mirror else "no mirror"
    return (lambda seqs: judges.class_probs(net, seqs)), (
        f"{path.name} (tools.judge, widths {net.widths}, {read}; "
        f"{meta['record'].get('test_accuracy', float('nan')):.4f} when trained)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default=shipped.DEFAULT)
    p.add_argument("--data-root", default=None, help="folder of the dataset (default: the checkpoint's)")
    p.add_argument("--guidance", type=float, nargs="+", default=[1.0, 2.0, 3.0])
    p.add_argument("--per-class", type=int, default=100)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=100, help="images sampled together")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default="bench")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--precision", default="float32", help="the sampler's products: float32, int8, bfloat16 or auto")
    p.add_argument("--judge", default=None,
                   help="the judge (its test accuracy is always measured again): a .safetensors that "
                        "tools.judge wrote; 'small' to train the small CNN; another FILE: the small "
                        "CNN's weights, read when it exists, else written after training (default: the shipped "
                        "judge for CIFAR-10 and MNIST models, else the small CNN trained anew)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    path = shipped.resolve(args.checkpoint)
    ck = checkpoint.load(path)
    model = checkpoint.model_from_checkpoint(ck, path).eval()
    info = dataset_info(ck["config"]["data"])
    if not model.num_classes:
        raise SystemExit(f"error: {path} is an unconditional model; this benchmark needs a class-conditional one.")
    overrides = {"root": args.data_root}
    train, test = load_from_config({**ck["config"]["data"], "val_fraction": 0.0}, ("train", "test"), overrides,
                                   labels=True)
    start = time.perf_counter()
    probs_of, description = judge(args, train, info, ck["config"]["data"].get("name"))
    accuracy = (probs_of(test[0]).argmax(-1) == test[1]).float().mean().item()
    print(f"judge: {description}, {time.perf_counter() - start:.0f} s; test accuracy {accuracy:.4f} on "
          f"{len(test[0])} images")
    asked = torch.arange(model.num_classes).repeat_interleave(args.per_class)
    dtype = decide_precision(args.precision, torch.device("cpu"), dims=model_dims(model), batch=args.batch_size,
                             record=ck.get("record")).value
    rows = []
    for guidance in args.guidance:
        start = time.perf_counter()
        seqs = generate(model, len(asked), labels=asked, guidance=guidance, seed=args.seed,
                        batch_size=args.batch_size, progress=True, desc=f"guidance {guidance:g}", dtype=dtype)
        seconds = time.perf_counter() - start
        probs = probs_of(seqs)
        hit = probs.argmax(-1) == asked
        own_bpd = bits_per_dim(model, seqs, args.batch_size, torch.device("cpu"), labels=asked)
        row = {"guidance": guidance, "precision": dtype_name(dtype), "samples": len(asked),
               "recognised": hit.float().mean().item(),
               "confidence": probs[torch.arange(len(asked)), asked].mean().item(), "samples_bpd": own_bpd,
               "seconds": seconds}
        row.update({f"class_{c}": hit[asked == c].float().mean().item() for c in range(model.num_classes)})
        rows.append(row)
        print(f"guidance {guidance:g}: {row['recognised']:.3f} recognised as the class asked for, judge's confidence "
              f"{row['confidence']:.3f}, the samples' own bits/dim {own_bpd:.4f} ({seconds:.0f} s)")
    columns = [("guidance", "guidance", "{:g}"), ("precision", "precision", "{}"), ("recognised", "all", "{:.3f}"),
               ("confidence", "confidence", "{:.3f}"), ("samples_bpd", "samples' bits/dim", "{:.4f}")] + [
        (f"class_{c}", info.class_names[c], "{:.2f}") for c in range(model.num_classes)]
    md = (f"Share of samples recognised as the class asked for ({args.per_class} per class; checkpoint {path}; "
          f"judge: {description}, test accuracy {accuracy:.4f} on {len(test[0])} test images; "
          f"{machine()})\n\n" + markdown_table(rows, columns))
    write_outputs(args.out_dir, "label_accuracy", {"checkpoint": str(path), "judge": description,
                                                   "classifier_test_accuracy": accuracy,
                                                   "machine": machine(), "rows": rows}, md)


if __name__ == "__main__":
    one_line(main)()
