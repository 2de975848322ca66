"""The judges: small airbench-style CNNs that read which class an image of a data set shows (the
colour judge for CIFAR-10's 32x32x3, the digit judge for MNIST's 28x28x1), each trained once,
reproducibly, and shipped as checkpoints/judges/NAME.{safetensors,json,md} (label_accuracy's default
judge for that data set's models; the judges folder keeps them out of the models that checkpoint= names).

    python -m tools.judge [--dataset cifar10|mnist] --data-root DIR --out checkpoints/judges/NAME
        [--widths W0 W1 W2] [--epochs E] [--batch-size 256] [--lr 0.2] [--seed 0] [--threads 1]
    python -m tools.judge --probe [--dataset ...] [--widths ...]     # training images/s, a few batches

The net (widths w0 w1 w2): a 3x3 stem conv (channels -> w0) then three groups, each conv -> max-pool 2
-> BatchNorm -> GELU -> conv -> BatchNorm -> GELU (w0 -> w1 -> w2 channels at 1/2, 1/4, 1/8 of the
side, rounded down), a global max-pool and a linear layer; the input's shape is the data set's
(dataset_info). Training: random translations by up to 2 pixels, random horizontal flips where the
data set's RECIPE allows them (not for digits: a mirrored digit changes meaning), label smoothing 0.2,
SGD with Nesterov momentum 0.9 and weight decay 5e-4, the learning rate rising linearly for the first
fifth of the steps and falling linearly to 0; channels_last; the seed fixes everything on one thread.
Where flips are allowed it reads an image as the average of its and its mirror image's class
probabilities (recorded as "tta": "hflip"; else "tta": "none").

  NAME.safetensors  the weights (float32; BatchNorm's running statistics included)
  NAME.json         {"format": "imagegen-judge/1", "weights_sha256", "architecture": {"widths", "classes",
                     "dataset"}, "record": {"test_accuracy", "test_images", "epochs", ...}}; `load` refuses
                     weights whose sha256 is not the recorded one (no "dataset": cifar10, the first judge's)
  NAME.md           the judge's card: the command, the CPU, the minutes, the test accuracy
"""
import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from imagegen.data.sets import dataset_info
from imagegen.errors import UserError, one_line
from imagegen.files import read_json
from imagegen.tuning.machine import cpu_name


@dataclass(frozen=True)
class Recipe:
    """A data set's judge: its pixels' mean and std per channel, whether mirror images keep the class
    (flips in training and the mirror averaged in at test time), the border a shift fills (reflect or
    zeros) and the defaults of --widths and --epochs; kind, title and data_note word its card."""
    mean: tuple
    std: tuple
    mirror: bool
    pad: str
    widths: tuple
    epochs: int
    kind: str
    title: str
    data_note: str = ""


RECIPES = {
    "cifar10": Recipe((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), mirror=True, pad="reflect",
                      widths=(32, 64, 128), epochs=14, kind="colour", title="CIFAR-10 test images",
                      data_note="the shared CIFAR-10 decoded from a JPEG re-encoding (../shared/data/README.md on "
                                "these machines); its accuracy on the original PNG pixels may differ slightly"),
    "mnist": Recipe((0.1307,), (0.3081,), mirror=False, pad="constant", widths=(16, 32, 64), epochs=6,
                    kind="digit", title="MNIST test digits"),
}
FORMAT = "imagegen-judge/1"
SHIPPED = {name: Path(__file__).resolve().parents[1] / "checkpoints" / "judges" / f"{name}.safetensors"
           for name in RECIPES}
MAX_JSON_BYTES = 1 << 16
SCALE = 1 / 8           # the logits' fixed scale (as airbench's 1/9): a max-pooled head starts out too sure
WRITE_FIX = "free space or choose another --out"
FIX = "train it again with python -m tools.judge, or restore checkpoints/judges/ from the repository"


def conv_bn(c_in, c_out):
    return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.GELU()]


def group(c_in, c_out):
    """conv -> max-pool 2 -> BatchNorm -> GELU -> conv -> BatchNorm -> GELU: (N, c_in, H, W) -> (N, c_out, H/2, W/2)."""
    first = conv_bn(c_in, c_out)
    return nn.Sequential(first[0], nn.MaxPool2d(2), *first[1:], *conv_bn(c_out, c_out))


class Judge(nn.Module):
    """(N, C, H, W) images in [0, 1] of `dataset` -> (N, classes) logits; widths (w0, w1, w2)."""

    def __init__(self, widths=(32, 64, 128), classes=10, dataset="cifar10"):
        super().__init__()
        w0, w1, w2 = widths
        recipe, self.info = RECIPES[dataset], dataset_info(dataset)
        self.widths, self.classes, self.dataset, self.mirror = list(widths), classes, dataset, recipe.mirror
        c = self.info.channels
        self.register_buffer("mean", torch.tensor(recipe.mean).view(1, c, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(recipe.std).view(1, c, 1, 1), persistent=False)
        self.net = nn.Sequential(*conv_bn(c, w0), group(w0, w0), group(w0, w1), group(w1, w2),
                                 nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(w2, classes, bias=False))

    def forward(self, x):
        return self.net((x - self.mean) / self.std) * SCALE


def as_images(seqs, height=32, width=32, channels=3):
    """(N, D) uint8 sequences (pixel-major, channels last) -> (N, C, H, W) float in [0, 1], channels_last."""
    x = seqs.reshape(-1, height, width, channels).permute(0, 3, 1, 2).float() / 255
    return x.contiguous(memory_format=torch.channels_last)


def augment(x, generator, shift=2, mirror=True, pad="reflect"):
    """x (N, C, H, W): each image mirrored with probability 1/2 when `mirror` and moved by up to `shift`
    pixels each way (the border `pad`: reflect, or constant for zeros)."""
    n, _, h, w = x.shape
    if mirror:
        flip = torch.rand(n, generator=generator) < 0.5
        x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
    padded = nn.functional.pad(x, (shift,) * 4, mode=pad)
    dy, dx = (torch.randint(0, 2 * shift + 1, (n,), generator=generator) for _ in range(2))
    rows = (dy.view(-1, 1) + torch.arange(h)).view(n, 1, h, 1).expand(n, x.shape[1], h, w + 2 * shift)
    padded = padded.gather(2, rows)
    cols = (dx.view(-1, 1) + torch.arange(w)).view(n, 1, 1, w).expand(n, x.shape[1], h, w)
    return padded.gather(3, cols).contiguous(memory_format=torch.channels_last)


def lr_at(step, total, peak, warm=0.2):
    """One cycle: linear from peak/10 up to peak over the first `warm` share of the steps, then linear to 0."""
    rise = max(1, int(total * warm))
    if step < rise:
        return peak * (0.1 + 0.9 * step / rise)
    return peak * max(0.0, (total - step) / max(1, total - rise))


def train(seqs, labels, dataset="cifar10", widths=None, epochs=10, batch=256, lr=0.2, seed=0, log=print,
          max_steps=None):
    """A Judge of `dataset` (widths None: its recipe's) trained on seqs (N, D) uint8 with labels (N,);
    log(line) after each epoch."""
    recipe = RECIPES[dataset]
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    net = Judge(widths or recipe.widths, dataset_info(dataset).num_classes, dataset)
    net = net.to(memory_format=torch.channels_last)
    decay = [p for p in net.parameters() if p.dim() > 1]
    rest = [p for p in net.parameters() if p.dim() <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 5e-4}, {"params": rest, "weight_decay": 0.0}],
                          lr=lr, momentum=0.9, nesterov=True)
    per_epoch = len(seqs) // batch if len(seqs) >= batch else 1
    total = max_steps or epochs * per_epoch
    step, start = 0, time.perf_counter()
    net.train()
    for epoch in range(epochs):
        seen, loss_sum = 0, 0.0
        for idx in torch.randperm(len(seqs), generator=g)[:per_epoch * batch].split(batch):
            if step >= total:
                break
            for group_ in opt.param_groups:
                group_["lr"] = lr_at(step, total, lr)
            x = augment(images(net, seqs[idx]), g, mirror=recipe.mirror, pad=recipe.pad)
            loss = nn.functional.cross_entropy(net(x), labels[idx], label_smoothing=0.2)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            seen += len(idx)
            loss_sum += loss.item() * len(idx)
        log(f"epoch {epoch + 1}/{epochs}: loss {loss_sum / max(seen, 1):.4f}, {time.perf_counter() - start:.0f} s")
    return net.eval()


def images(net, seqs):
    """seqs (N, D) uint8 -> the judge's input (N, C, H, W), at its data set's shape."""
    return as_images(seqs, net.info.height, net.info.width, net.info.channels)


@torch.no_grad()
def class_probs(net, seqs, chunk=500, mirror=None):
    """The judge's class probabilities (N, classes) of seqs (N, D) uint8: where its data set allows mirrors
    (mirror None: net.mirror), the mean of each image's and its mirror image's."""
    mirror = net.mirror if mirror is None else mirror
    out = []
    for part in seqs.split(chunk):
        x = images(net, part)
        p = torch.softmax(net(x), -1)
        out.append((p + torch.softmax(net(x.flip(-1)), -1)) / 2 if mirror else p)
    return torch.cat(out)


def accuracy(net, seqs, labels, mirror=None):
    return (class_probs(net, seqs, mirror=mirror).argmax(-1) == labels).float().mean().item()


def save(stem, net, record):
    """Write STEM.safetensors and STEM.json (architecture, record, weights_sha256); returns the two paths."""
    from safetensors.torch import save as st_save

    from imagegen.files import sha256, write_bytes

    path = Path(stem).with_suffix(".safetensors")
    state = {k: v.detach().contiguous().cpu() for k, v in net.state_dict().items()}
    write_bytes(path, st_save(state), "judge weights", WRITE_FIX)
    meta = {"format": FORMAT, "weights_sha256": sha256(path), "architecture": {
        "name": "judge", "widths": net.widths, "classes": net.classes, "dataset": net.dataset}, "record": record}
    config = path.with_suffix(".json")
    write_bytes(config, (json.dumps(meta, indent=1) + "\n").encode(), "judge config", WRITE_FIX)
    return path, config


def read_meta(path):
    """The .json beside the judge weights `path`, checked: a dict of FORMAT with widths, classes and a data
    set of RECIPES (filled in as cifar10 where absent, as in the first judge's)."""
    config = Path(path).with_suffix(".json")
    meta = read_json(config, MAX_JSON_BYTES, "judge config", f"{FIX}.")
    arch = meta.get("architecture") if isinstance(meta, dict) else None
    ok = (isinstance(arch, dict) and meta.get("format") == FORMAT and isinstance(arch.get("widths"), list)
          and len(arch["widths"]) == 3 and all(isinstance(w, int) and 0 < w <= 1024 for w in arch["widths"])
          and isinstance(arch.get("classes"), int) and 0 < arch["classes"] <= 1000
          and arch.setdefault("dataset", "cifar10") in RECIPES)
    if not ok:
        raise UserError(f"{config} is not a judge config of format {FORMAT} (three widths, a class count and a "
                        f"data set of {', '.join(RECIPES)} under \"architecture\"); {FIX}.")
    return meta


def load(path):
    """(Judge in evaluation mode, its .json as a dict) from the weights at `path`; one UserError sentence when
    the files are missing, damaged or altered (the weights' sha256 must be the one recorded)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from imagegen.files import sha256

    path = Path(path)
    meta = read_meta(path)
    try:
        digest = sha256(path)
    except OSError as e:
        raise UserError(f"{path} cannot be read ({e.strerror or e}); {FIX}.") from None
    if meta.get("weights_sha256") != digest:
        raise UserError(f"{path} does not match the weights_sha256 recorded in {path.with_suffix('.json').name} "
                        f"(damaged or altered since it was written); {FIX}.")
    try:
        state = load_file(str(path))
        arch = meta["architecture"]
        net = Judge(arch["widths"], arch["classes"], arch["dataset"])
        net.load_state_dict(state)
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise UserError(f"{path} does not hold the judge its config describes ({reason}); {FIX}.") from None
    return net.eval(), meta


def macs(widths, info):
    """Multiply-adds of one forward pass on an image of DatasetInfo `info`."""
    w0, w1, w2 = widths
    area = [(info.height >> k) * (info.width >> k) for k in range(4)]      # at 1, 1/2, 1/4, 1/8 of the side
    return 9 * (info.channels * w0 * area[0] + w0 * w0 * area[0] + w0 * w0 * area[1] + w0 * w1 * area[1]
                + w1 * w1 * area[2] + w1 * w2 * area[2] + w2 * w2 * area[3])


def probe(dataset, widths, batch, steps=4):
    """Training images/s of widths on random images of dataset's shape (one warm-up step, then `steps`),
    thread CPU time."""
    info = dataset_info(dataset)
    x = torch.randint(0, 256, (batch * (steps + 1), info.length), dtype=torch.uint8)
    y = torch.randint(0, info.num_classes, (len(x),))
    start = time.thread_time()
    train(x[:batch], y[:batch], dataset, widths, epochs=1, batch=batch, log=lambda _: None)
    warm = time.thread_time() - start
    start = time.thread_time()
    train(x[batch:], y[batch:], dataset, widths, epochs=1, batch=batch, log=lambda _: None)
    return batch * steps / (time.thread_time() - start), warm


def card(args, record, command):
    r, recipe = record, RECIPES[args.dataset]
    read = (f"each read as the mean of it and its mirror image; without the mirror {r['test_accuracy_no_tta']:.4f}"
            if recipe.mirror else "each read as it is: no mirror image, which would change a digit's meaning")
    return (f"# {args.dataset} judge\n\nThe {recipe.kind} judge of `tools.label_accuracy` for {args.dataset} models "
            f"(tools/judge.py): a small airbench-style CNN, widths {r['widths']} "
            f"({r['macs'] / 1e6:.1f} M multiply-adds a forward pass, {r['params']:,} parameters), "
            f"not part of any generative model.\n\n"
            f"- test accuracy: **{r['test_accuracy']:.4f}** on all {r['test_images']:,} {recipe.title} ({read})\n"
            f"- trained on {r['train_images']:,} training images ({args.data_root}), {r['epochs']} epochs, "
            f"batch {r['batch_size']}, peak lr {r['lr']}, seed {r['seed']}, {r['threads']} thread(s), "
            f"{r['minutes']:.1f} minutes of wall time on a CPU ({r['cpu']}; no GPU), torch {r['torch']}\n"
            + (f"- data: {recipe.data_note}\n" if recipe.data_note else "") +
            f"\nReproduce from the repository root (the same weights are expected on one thread with the same torch "
            f"and CPU kind):\n\n    {command}\n\n"
            f"Per epoch:\n\n" + "\n".join(f"    {line}" for line in r["log"]) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", choices=sorted(RECIPES), default="cifar10")
    p.add_argument("--data-root", default=None,
                   help="the data set's folder (default: $IMAGEGEN_DATA/NAME or data/NAME)")
    p.add_argument("--out", default=None,
                   help="STEM: writes STEM.safetensors, .json, .md (default: checkpoints/judges/NAME)")
    p.add_argument("--widths", type=int, nargs=3, default=None, help="default: the data set's recipe's")
    p.add_argument("--epochs", type=int, default=None, help="default: the data set's recipe's")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--probe", action="store_true", help="print training images/s of --widths and stop")
    args = p.parse_args(argv)
    from imagegen.store.shipped import default_root

    recipe, info = RECIPES[args.dataset], dataset_info(args.dataset)
    args.widths = list(args.widths or recipe.widths)
    args.epochs = args.epochs or recipe.epochs
    args.data_root = args.data_root or default_root(args.dataset)
    args.out = args.out or f"checkpoints/judges/{args.dataset}"
    torch.set_num_threads(args.threads)
    if args.probe:
        rate, warm = probe(args.dataset, args.widths, args.batch_size)
        print(f"widths {args.widths}: {macs(args.widths, info) / 1e6:.1f} M MACs, {rate:.0f} training images/s "
              f"(one thread's CPU time; first step {warm:.1f} s)")
        return
    from imagegen.data.splits import load_splits

    loaded = load_splits(args.dataset, args.data_root, ("train", "val", "test"), val_fraction=0.0)
    # every training image: load_splits keeps one for "val" even at val_fraction 0 (the judges before
    # 2026-11-29, cifar10's among them, trained without it)
    x, y = (torch.cat(pair) for pair in zip(loaded["train"], loaded["val"]))
    tx, ty = loaded["test"]
    lines = []

    def log(line):
        lines.append(line)
        print(line, flush=True)

    start = time.perf_counter()
    net = train(x, y, args.dataset, args.widths, args.epochs, args.batch_size, args.lr, args.seed, log)
    minutes = (time.perf_counter() - start) / 60
    plain, acc = accuracy(net, tx, ty, mirror=False), accuracy(net, tx, ty)
    print(f"test accuracy {acc:.4f} on {len(tx)} images (without the mirror {plain:.4f}); {minutes:.1f} minutes")
    record = {"test_accuracy": acc, "test_accuracy_no_tta": plain, "test_images": len(tx),
              "tta": "hflip" if recipe.mirror else "none", "dataset": args.dataset,
              "train_images": len(x), "epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
              "seed": args.seed, "threads": args.threads, "widths": args.widths, "macs": macs(args.widths, info),
              "params": sum(t.numel() for t in net.parameters()), "minutes": round(minutes, 2),
              "cpu": f"{cpu_name()}, {os.cpu_count()} CPUs", "torch": torch.__version__, "log": lines}
    command = "python -m tools.judge " + " ".join(sys.argv[1:] if argv is None else argv)
    record["command"] = command
    path, _ = save(args.out, net, record)
    from imagegen.files import write_bytes
    write_bytes(path.with_suffix(".md"), card(args, record, command).encode(), "judge card", WRITE_FIX)
    print(f"wrote {path} and its .json, .md")


if __name__ == "__main__":
    one_line(main)()
