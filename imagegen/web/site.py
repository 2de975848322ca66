"""The static web page that samples a linear-attention model as an RNN in JavaScript.

The site, servable by any static file server (python -m http.server -d DIR):
  index.html, page.js        the page: grid sampling, completion of a drawn top half, window.imagegen
  worker.js, sampler.js      the sampling loop (Web Worker) and the arithmetic of PixelTransformer.step
  draw.js                    the heads' probabilities and the seeded draw
  kernels.wasm               the products and the attention on WebAssembly SIMD (kernels.wat assembled)
  model.safetensors          the state_dict in float32 (8-byte LE header length, JSON header, raw LE data);
                             precision=int8: each Dense layer's weight X.weight int8 beside its float32
                             scales X.weight_scale (store.shipped.int8_state), float32 again on the page
  config.json                architecture, image shape, head, classes (num_classes, class_names), guidance
  examples.bin               a few test images (N x D uint8) for the completion mode, when the data is there
                             (their labels: config.json's example_labels)
The safetensors file is written here (a dozen lines) rather than with the `safetensors` package: the
format is that simple and the page reads it with as little code, so no runtime dependency is added.
"""
import json
import struct
from pathlib import Path

import numpy as np
import torch

from ..data.sets import dataset_info
from ..errors import UserError
from ..files import write_folder
from ..model.transformer import START
from ..ops import EPS
from ..store.shipped import int8_state

WEB_DIR = Path(__file__).resolve().parent
PAGE_FILES = ("index.html", "page.js", "worker.js", "sampler.js", "draw.js", "kernels.wasm")


def safetensors_bytes(tensors):
    """{name: tensor} -> the bytes of a safetensors file holding them as float32 (int8 tensors as int8)."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        kind = ("I8", torch.int8, "i1") if t.dtype == torch.int8 else ("F32", torch.float32, "<f4")
        blob = t.detach().cpu().to(kind[1]).contiguous().numpy().astype(kind[2]).tobytes()
        header[name] = {"dtype": kind[0], "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)          # the data starts 8-byte aligned (the format pads with spaces)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def page_config(model, dataset, guidance=1.0):
    """What sampler.js needs besides the weights (config.json): the architecture, the image shape, the
    head (head_params: P per position), the classes (num_classes 0: unconditional; the page offers a
    class picker otherwise), the context distances and the page's default guidance; n_params counts the
    model's parameters.
    dataset: a name (mnist) or a checkpoint's data section (a folder's size and classes come from it)."""
    attn = model.blocks[0].attn
    if attn.name != "linear":
        raise UserError(f"this checkpoint uses {attn.name} attention, but the browser sampler runs linear attention "
                        f"only (an RNN with constant state); export a checkpoint trained with model=linear.")
    if not attn.plain_elu:
        raise UserError(f"this checkpoint's linear attention uses feature_map={attn.feature_map.name}, "
                        f"gate={attn.gate}, but the browser sampler runs only elu + 1 without a gate; sample it "
                        f"with imagegen-sample, or export a checkpoint trained with the default feature map.")
    if model.activation != "gelu":
        raise UserError(f"this checkpoint's feed-forward uses activation={model.activation}, but the browser sampler "
                        f"runs gelu only; sample it with imagegen-sample, or export a checkpoint trained with gelu.")
    info = dataset_info(dataset)
    return {"dataset": info.name, "height": info.height, "width": info.width, "channels": info.channels,
            "length": info.length, "n_layers": len(model.blocks), "d_model": attn.d_model, "n_heads": attn.n_heads,
            "d_ff": model.blocks[0].ff[0].weight.shape[1], "head": model.head.name,
            "n_mixtures": getattr(model.head, "n_mixtures", None), "head_params": model.head.n_params,
            "n_params": sum(p.numel() for p in model.parameters()),
            "num_classes": model.num_classes, "class_names": list(info.class_names) if model.num_classes else [],
            "context": list(model.context),
            "guidance": float(guidance),
            "min_log_scale": getattr(model.head, "MIN_LOG_SCALE", None), "ln_eps": model.ln_f.eps,
            "attention_eps": EPS, "start_token": START}


def write_site(model, dataset, out, examples=None, guidance=1.0, overwrite=False, precision="float32"):
    """Write the site for `model` (a PixelTransformer with linear attention) of `dataset` into
    folder `out`, with examples (n, D) uint8 (or a pair: those and their labels (n,)) or None, the
    page's default guidance and the weights' precision (float32 or int8); returns
    {file name: bytes written}. The site is built beside `out` and swapped in (files.write_folder):
    a failure leaves `out` as it was, and files there that the export did not write are replaced
    only with overwrite=True."""
    config = page_config(model, dataset, guidance)
    examples, labels = examples if isinstance(examples, tuple) else (examples, None)
    config["examples"] = 0 if examples is None else len(examples)
    # the class each example shows: picking one on the page takes its class (a 7's top half is completed as a 7)
    config["example_labels"] = [] if labels is None else [int(v) for v in labels]
    files = {name: (WEB_DIR / name).read_bytes() for name in PAGE_FILES}
    files["model.safetensors"] = safetensors_bytes(int8_state(model) if precision == "int8" else model.state_dict())
    files["config.json"] = (json.dumps(config, indent=1) + "\n").encode()
    if examples is not None:
        files["examples.bin"] = np.ascontiguousarray(examples.numpy(), dtype=np.uint8).tobytes()
    return write_folder(out, files, "site", overwrite,
                        fix="free space or fix the folder's permissions, or pass out=DIR naming a folder you can "
                            "write to")
