"""Do a class-conditional model's samples show the class asked for? A small CNN digit classifier is
trained on the model's own training files, its accuracy measured on the test set, then it labels
`--per-class` samples of every class at each guidance; the table gives the share recognised as the
class asked for, per class and overall, and two measures that see guidance overshoot, which the share
alone rewards: the judge's mean confidence in the class asked for, and the model's own bits/dim of
its samples given their labels (near its test bits/dim at guidance 1; streaks and speckles raise it).

    python -m imagegen.benchmarks.label_accuracy [--checkpoint mnist-linear] [--data-root DIR]
        [--guidance 1 2 3] [--per-class 100] [--epochs 4] [--threads N] [--judge FILE] [--out-dir bench]
        [--precision float32|int8|auto]

Writes bench/label_accuracy.{json,md}. The classifier is a judge, not part of imagegen: two 3x3
convolutions with max-pooling and a linear layer (the classic small MNIST CNN, colour input for
CIFAR-10), Adam, seeded. --precision: the sampler's products (int8: 8-bit weights; the samples' own
bits/dim are always scored in float32, by the model as trained).
"""
import argparse
import time
from pathlib import Path

import torch
from torch import nn

from ..store import checkpoint, shipped
from ..data.sets import dataset_info, load_from_config
from ..bits_per_dim import bits_per_dim
from ..dtypes import dtype_name
from ..model.transformer import model_dims
from ..precision import resolve_precision
from ..sampling.decode import generate
from .report import machine, markdown_table, write_outputs
from ..errors import one_line


def classifier(channels, classes, height, width):
    return nn.Sequential(nn.Conv2d(channels, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(64 * (height // 4) * (width // 4), classes))


def as_input(seqs, info):
    """(N, D) uint8 sequences -> (N, C, H, W) float in [0, 1]."""
    return seqs.reshape(-1, info.height, info.width, info.channels).permute(0, 3, 1, 2).float() / 255


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


def predict(net, x, info):
    return class_probs(net, x, info).argmax(-1)


def load_judge(path, info):
    """The classifier whose weights `--judge` wrote to path (tensors only), in evaluation mode."""
    net = classifier(info.channels, info.num_classes, info.height, info.width)
    net.load_state_dict(torch.load(path, weights_only=True))
    return net.eval()


def judge(args, train, info):
    """The classifier: read from --judge when that file exists, else trained (and saved there when
    --judge names a file)."""
    if args.judge and Path(args.judge).is_file():
        return load_judge(args.judge, info)
    net = train_classifier(*train, info, args.epochs, args.seed)
    if args.judge:
        torch.save(net.state_dict(), args.judge)
    return net


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
    p.add_argument("--judge", default=None, help="file of the classifier's weights: read when it exists (its test "
                                                 "accuracy is measured again), else written after training")
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
    net = judge(args, train, info)
    accuracy = (predict(net, test[0], info) == test[1]).float().mean().item()
    print(f"classifier: {len(train[0])} training images, {args.epochs} epochs, {time.perf_counter() - start:.0f} s; "
          f"test accuracy {accuracy:.4f} on {len(test[0])} images")
    asked = torch.arange(model.num_classes).repeat_interleave(args.per_class)
    dtype = resolve_precision(args.precision, torch.device("cpu"), dims=model_dims(model), batch=args.batch_size,
                              record=ck.get("record"))
    rows = []
    for guidance in args.guidance:
        start = time.perf_counter()
        seqs = generate(model, len(asked), labels=asked, guidance=guidance, seed=args.seed,
                        batch_size=args.batch_size, progress=True, desc=f"guidance {guidance:g}", dtype=dtype)
        seconds = time.perf_counter() - start
        probs = class_probs(net, seqs, info)
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
          f"judge: a small CNN trained on the {len(train[0])} training images, test accuracy {accuracy:.4f}; "
          f"{machine()})\n\n" + markdown_table(rows, columns))
    write_outputs(args.out_dir, "label_accuracy", {"checkpoint": str(path), "classifier_test_accuracy": accuracy,
                                                   "machine": machine(), "rows": rows}, md)


if __name__ == "__main__":
    one_line(main)()
