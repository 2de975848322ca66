"""How much a shipped class-conditional model knows of its classes (docs/guidance.md, "What the colour
model knows of its classes"), two measures with the model's own likelihoods:

    python docs/notes/class_evidence.py classify MODEL N DATA_ROOT
        the model as a classifier: argmax over c of log p(x | c) for the first N test images (Bayes with
        a flat prior), and the mean evidence log p(x | true c) - log p(x | no label) in nats
    python docs/notes/class_evidence.py best-of MODEL PER_CLASS K G JUDGE.pt
        best of k: K samples at guidance G for each image asked for (PER_CLASS a class), keep the one
        the model finds most like its class (largest log p(x | c) - log p(x | no label)) or likeliest
        (largest log p(x | c)); the judge's share read as asked for k = 1..K, each way

One thread. JUDGE.pt: the weights `python -m tools.label_accuracy --judge` wrote.
"""
import json
import math
import sys
import time

import torch

import imagegen
from tools.label_accuracy import class_probs, load_judge
from imagegen.sampling.decode import generate


def log_p(module, x, labels, batch=50):
    """log p(x | label) in nats (N,) of images x (N, D) uint8; labels (N,) or one class number for all
    (-1: no label)."""
    labels = torch.full((len(x),), labels) if isinstance(labels, int) else labels
    with torch.no_grad():
        return torch.cat([-module.nll(s, y).double().sum(1) for s, y in zip(x.split(batch), labels.split(batch))])


def classify(name, n, root):
    model = imagegen.load(name, threads=1)
    x, y = model.load_split("test", n=int(n), root=root)
    x, y = torch.as_tensor(x).reshape(len(x), -1), torch.as_tensor(y)
    start = time.time()
    by_class = torch.stack([log_p(model.module, x, c) for c in range(model.module.num_classes)], 1)   # (N, C)
    evidence = by_class[torch.arange(len(y)), y] - log_p(model.module, x, -1)
    print(json.dumps({"model": name, "images": len(y),
                      "accuracy": round((by_class.argmax(1) == y).float().mean().item(), 3),
                      "evidence_nats": round(evidence.mean().item(), 2), "seconds": round(time.time() - start)}))


def best_of(name, per, K, G, judge_path):
    per, K, G = int(per), int(K), float(G)
    model = imagegen.load(name, threads=1)
    info, module = model.info, model.module
    net = load_judge(judge_path, info)
    asked = torch.arange(info.num_classes).repeat_interleave(per)           # (R,)
    R = len(asked)
    labels = asked.repeat(K)                                                # candidate j of request i: j * R + i
    seqs = generate(module, len(labels), labels=labels, guidance=G, seed=0, batch_size=100)
    cond, uncond = log_p(module, seqs, labels, 100), log_p(module, seqs, -1, 100)
    probs = class_probs(net, seqs, info)
    hit, confidence = probs.argmax(-1) == labels, probs[torch.arange(len(labels)), labels]
    for by, score in (("evidence", (cond - uncond).view(K, R)), ("likelihood", cond.view(K, R))):
        for k in range(1, K + 1):
            pick = score[:k].argmax(0) * R + torch.arange(R)
            print(json.dumps({"by": by, "k": k, "G": G, "read_as_asked": round(hit[pick].float().mean().item(), 3),
                              "confidence": round(confidence[pick].mean().item(), 3),
                              "samples_bpd": round(-cond[pick].mean().item() / (module.length * math.log(2)), 4)}))


if __name__ == "__main__":
    torch.set_num_threads(1)
    runs = {"classify": (classify, 3), "best-of": (best_of, 5)}
    if len(sys.argv) < 2 or sys.argv[1] not in runs or len(sys.argv) != 2 + runs[sys.argv[1]][1]:
        sys.exit(__doc__)
    runs[sys.argv[1]][0](*sys.argv[2:])
