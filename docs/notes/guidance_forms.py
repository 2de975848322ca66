"""Forms of classifier-free guidance on a shipped class-conditional model, read by a judge (docs/guidance.md,
"Other forms on the colour model"): the share of samples read as the class asked for, the judge's confidence
and the model's own bits/dim of its samples, for each form given as JSON.

    python docs/notes/guidance_forms.py MODEL PER_CLASS JUDGE.pt '{"G": 6}' '{"G": 12, "sched": "late"}' ...

A form: G, the bound B (default 0.5), the temperature T (default 1) and sched, how G varies with the
position t of D sub-pixels: const; early (from G at t = 0 down to 1 at the last); late (from 1 up to G);
front (G over the first third, then 1 + (G - 1) / 4). JUDGE.pt: the weights `label_accuracy --judge` wrote.
It replaces `heads.guided_probs` in this process only; one thread.
"""
import json
import sys
import time

import torch

import imagegen
from tools.label_accuracy import class_probs, load_judge
from imagegen.model import heads
from imagegen.sampling.decode import generate


def form(G, B, sched, D):
    """A guided_probs with bound B whose guidance follows `sched` over the D positions of each image
    (the sampler asks once per position, in order)."""
    calls = [0]

    def guided(head, params, params_uncond=None, guidance=1.0):
        t = calls[0] % D
        calls[0] += 1
        p = head.probs(params)
        if params_uncond is None:
            return p
        f = t / (D - 1)
        g = {"const": G, "early": 1 + (G - 1) * (1 - f), "late": 1 + (G - 1) * f,
             "front": G if f < 1 / 3 else 1 + (G - 1) / 4}[sched]
        tiny = torch.finfo(p.dtype).tiny
        log_c, log_u = torch.log(p.clamp_min(tiny)), torch.log(head.probs(params_uncond).clamp_min(tiny))
        return torch.softmax(log_c + (g - 1) * (log_c - log_u).clamp(-B, B), -1)
    return guided


def main(name, per, judge_path, *forms):
    torch.set_num_threads(1)
    model = imagegen.load(name)
    info = model.info
    net = load_judge(judge_path, info)
    asked = torch.arange(info.num_classes).repeat_interleave(int(per))
    for cfg in map(json.loads, forms):
        heads.guided_probs = form(cfg["G"], cfg.get("B", 0.5), cfg.get("sched", "const"), model.module.length)
        start = time.time()
        seqs = generate(model.module, len(asked), labels=asked, guidance=cfg["G"], temperature=cfg.get("T", 1.0),
                        seed=0, batch_size=100)
        probs = class_probs(net, seqs, info)
        images = seqs.reshape(-1, info.height, info.width, info.channels).numpy()
        print(json.dumps({"form": cfg, "read_as_asked": round((probs.argmax(-1) == asked).float().mean().item(), 3),
                          "confidence": round(probs[torch.arange(len(asked)), asked].mean().item(), 3),
                          "samples_bpd": round(model.bits_per_dim(images, labels=asked), 4),
                          "seconds": round(time.time() - start)}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    main(*sys.argv[1:])
