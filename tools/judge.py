"""The colour judge: a small airbench-style CNN that reads which CIFAR-10 class a 32x32 image shows,
trained once, reproducibly, and shipped as checkpoints/judges/cifar10.{safetensors,json,md}
(label_accuracy's default judge for CIFAR-10 models; the judges folder keeps it out of the models
that checkpoint= names).

    python -m tools.judge --data-root /work/shared/data/cifar10 --out checkpoints/judges/cifar10
        [--widths 32 64 128] [--epochs 14] [--batch-size 256] [--lr 0.2] [--seed 0] [--threads 1]
    python -m tools.judge --probe [--widths ...]     # training images/s, a few batches

The net (widths w0 w1 w2): a 3x3 stem conv (3 -> w0) then three groups, each conv -> max-pool 2 ->
BatchNorm -> GELU -> conv -> BatchNorm -> GELU (w0 -> w1 -> w2 channels at 16, 8, 4 pixels), a global
max-pool and a linear layer. Training: random horizontal flips and translations by up to 2 pixels
(reflected borders), label smoothing 0.2, SGD with Nesterov momentum 0.9 and weight decay 5e-4, the
learning rate rising linearly for the first fifth of the steps and falling linearly to 0; channels_last;
the seed fixes everything on one thread. It reads an image as the average of its and its mirror
image's class probabilities (recorded as "tta": "hflip").

  NAME.safetensors  the weights (float32; BatchNorm's running statistics included)
  NAME.json         {"format": "imagegen-judge/1", "weights_sha256", "architecture": {"widths", "classes"},
                     "record": {"test_accuracy", "test_images", "epochs", ...}}; `load` refuses weights
                     whose sha256 is not the recorded one
  NAME.md           the judge's card: the command, the CPU, the minutes, the test accuracy
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

from imagegen.errors import UserError, one_line
from imagegen.files import read_json
from imagegen.tuning.machine import cpu_name

FORMAT = "imagegen-judge/1"
SHIPPED = {"cifar10": Path(__file__).resolve().parents[1] / "checkpoints" / "judges" / "cifar10.safetensors"}
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
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
    """(N, 3, H, W) images in [0, 1] -> (N, classes) logits; widths (w0, w1, w2)."""

    def __init__(self, widths=(32, 64, 128), classes=10):
        super().__init__()
        w0, w1, w2 = widths
        self.widths, self.classes = list(widths), classes
        self.register_buffer("mean", torch.tensor(MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(STD).view(1, 3, 1, 1), persistent=False)
        self.net = nn.Sequential(*conv_bn(3, w0), group(w0, w0), group(w0, w1), group(w1, w2),
                                 nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(w2, classes, bias=False))

    def forward(self, x):
        return self.net((x - self.mean) / self.std) * SCALE


def as_images(seqs, height=32, width=32, channels=3):
    """(N, D) uint8 sequences (pixel-major, channels last) -> (N, C, H, W) float in [0, 1], channels_last."""
    x = seqs.reshape(-1, height, width, channels).permute(0, 3, 1, 2).float() / 255
    return x.contiguous(memory_format=torch.channels_last)


def augment(x, generator, shift=2):
    """x (N, C, H, W): each image mirrored with probability 1/2 and moved by up to `shift` pixels each way
    (borders reflected)."""
    n, _, h, w = x.shape
    flip = torch.rand(n, generator=generator) < 0.5
    x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
    padded = nn.functional.pad(x, (shift,) * 4, mode="reflect")
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


def train(seqs, labels, widths=(32, 64, 128), epochs=10, batch=256, lr=0.2, seed=0, log=print, max_steps=None):
    """A Judge trained on seqs (N, 3072) uint8 with labels (N,); log(line) after each epoch."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    net = Judge(widths).to(memory_format=torch.channels_last)
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
            x = augment(as_images(seqs[idx]), g)
            loss = nn.functional.cross_entropy(net(x), labels[idx], label_smoothing=0.2)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            seen += len(idx)
            loss_sum += loss.item() * len(idx)
        log(f"epoch {epoch + 1}/{epochs}: loss {loss_sum / max(seen, 1):.4f}, {time.perf_counter() - start:.0f} s")
    return net.eval()


@torch.no_grad()
def class_probs(net, seqs, chunk=500):
    """The judge's class probabilities (N, classes) of seqs (N, 3072) uint8: the mean of each image's and its
    mirror image's."""
    out = []
    for part in seqs.split(chunk):
        x = as_images(part)
        out.append((torch.softmax(net(x), -1) + torch.softmax(net(x.flip(-1)), -1)) / 2)
    return torch.cat(out)


def accuracy(net, seqs, labels):
    return (class_probs(net, seqs).argmax(-1) == labels).float().mean().item()


def save(stem, net, record):
    """Write STEM.safetensors and STEM.json (architecture, record, weights_sha256); returns the two paths."""
    from safetensors.torch import save as st_save

    from imagegen.files import sha256, write_bytes

    path = Path(stem).with_suffix(".safetensors")
    state = {k: v.detach().contiguous().cpu() for k, v in net.state_dict().items()}
    write_bytes(path, st_save(state), "judge weights", WRITE_FIX)
    meta = {"format": FORMAT, "weights_sha256": sha256(path),
            "architecture": {"name": "judge", "widths": net.widths, "classes": net.classes}, "record": record}
    config = path.with_suffix(".json")
    write_bytes(config, (json.dumps(meta, indent=1) + "\n").encode(), "judge config", WRITE_FIX)
    return path, config


def read_meta(path):
    """The .json beside the judge weights `path`, checked: a dict of FORMAT with widths and classes."""
    config = Path(path).with_suffix(".json")
    meta = read_json(config, MAX_JSON_BYTES, "judge config", f"{FIX}.")
    arch = meta.get("architecture") if isinstance(meta, dict) else None
    ok = (isinstance(arch, dict) and meta.get("format") == FORMAT and isinstance(arch.get("widths"), list)
          and len(arch["widths"]) == 3 and all(isinstance(w, int) and 0 < w <= 1024 for w in arch["widths"])
          and isinstance(arch.get("classes"), int) and 0 < arch["classes"] <= 1000)
    if not ok:
        raise UserError(f"{config} is not a judge config of format {FORMAT} (three widths and a class count under "
                        f"\"architecture\"); {FIX}.")
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
        net = Judge(meta["architecture"]["widths"], meta["architecture"]["classes"])
        net.load_state_dict(state)
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise UserError(f"{path} does not hold the judge its config describes ({reason}); {FIX}.") from None
    return net.eval(), meta


def macs(widths, size=32):
    """Multiply-adds of one forward pass at size x size."""
    w0, w1, w2 = widths
    s = size
    return 9 * (3 * w0 * s * s + w0 * w0 * s * s + w0 * w0 * (s // 2) ** 2 + w0 * w1 * (s // 2) ** 2
                + w1 * w1 * (s // 4) ** 2 + w1 * w2 * (s // 4) ** 2 + w2 * w2 * (s // 8) ** 2)


def probe(widths, batch, steps=4):
    """Training images/s of widths on random images (one warm-up step, then `steps`), thread CPU time."""
    x = torch.randint(0, 256, (batch * (steps + 1), 3072), dtype=torch.uint8)
    y = torch.randint(0, 10, (len(x),))
    start = time.thread_time()
    train(x[:batch], y[:batch], widths, epochs=1, batch=batch, log=lambda _: None)
    warm = time.thread_time() - start
    start = time.thread_time()
    train(x[batch:], y[batch:], widths, epochs=1, batch=batch, log=lambda _: None)
    return batch * steps / (time.thread_time() - start), warm


def card(args, record, command):
    r = record
    return (f"# cifar10 judge\n\nThe colour judge of `tools.label_accuracy` for CIFAR-10 models "
            f"(tools/judge.py): a small airbench-style CNN, widths {r['widths']} "
            f"({r['macs'] / 1e6:.1f} M multiply-adds a forward pass, {r['params']:,} parameters), "
            f"not part of any generative model.\n\n"
            f"- test accuracy: **{r['test_accuracy']:.4f}** on all {r['test_images']:,} CIFAR-10 test images "
            f"(each read as the mean of it and its mirror image; without the mirror {r['test_accuracy_no_tta']:.4f})\n"
            f"- trained on {r['train_images']:,} training images ({args.data_root}), {r['epochs']} epochs, "
            f"batch {r['batch_size']}, peak lr {r['lr']}, seed {r['seed']}, {r['threads']} thread(s), "
            f"{r['minutes']:.1f} minutes of wall time on a CPU ({r['cpu']}; no GPU), torch {r['torch']}\n"
            f"- data: the shared CIFAR-10 decoded from a JPEG re-encoding (../shared/data/README.md on these "
            f"machines); its accuracy on the original PNG pixels may differ slightly\n\n"
            f"Reproduce from the repository root (the same weights are expected on one thread with the same torch "
            f"and CPU kind):\n\n    {command}\n\n"
            f"Per epoch:\n\n" + "\n".join(f"    {line}" for line in r["log"]) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-root", default="data/cifar10")
    p.add_argument("--out", default="checkpoints/judges/cifar10", help="STEM: writes STEM.safetensors, .json, .md")
    p.add_argument("--widths", type=int, nargs=3, default=[32, 64, 128])
    p.add_argument("--epochs", type=int, default=14)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--probe", action="store_true", help="print training images/s of --widths and stop")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.probe:
        rate, warm = probe(args.widths, args.batch_size)
        print(f"widths {args.widths}: {macs(args.widths) / 1e6:.1f} M MACs, {rate:.0f} training images/s "
              f"(one thread's CPU time; first step {warm:.1f} s)")
        return
    from imagegen.data.splits import load_splits

    loaded = load_splits("cifar10", args.data_root, ("train", "test"), val_fraction=0.0)
    (x, y), (tx, ty) = loaded["train"], loaded["test"]
    lines = []

    def log(line):
        lines.append(line)
        print(line, flush=True)

    start = time.perf_counter()
    net = train(x, y, args.widths, args.epochs, args.batch_size, args.lr, args.seed, log)
    minutes = (time.perf_counter() - start) / 60
    with torch.no_grad():
        plain = (torch.cat([net(as_images(part)).argmax(-1) for part in tx.split(500)]) == ty).float().mean().item()
    acc = accuracy(net, tx, ty)
    print(f"test accuracy {acc:.4f} on {len(tx)} images (without the mirror {plain:.4f}); {minutes:.1f} minutes")
    record = {"test_accuracy": acc, "test_accuracy_no_tta": plain, "test_images": len(tx), "tta": "hflip",
              "train_images": len(x), "epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
              "seed": args.seed, "threads": args.threads, "widths": args.widths, "macs": macs(args.widths),
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
