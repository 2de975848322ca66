"""Small datasets written in the real on-disk formats (IDX, CIFAR-10 and CIFAR-100 python pickles), and
where the real files of this project's machines are; the builders several test files share: small
models and checkpoints, attention inputs, and a local HTTP mirror serving fixture files."""
import gzip
import os
import pickle
from pathlib import Path

import numpy as np
import torch

from imagegen.model.transformer import PixelTransformer


def idx_bytes(array):
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_mnist(root, n_train=40, n_test=16, gz=True, seed=0, folder="MNIST/raw"):
    """Blobby 28x28 'digits' (mostly 0 with bright strokes, like MNIST) in <root>/<folder> (Fashion-MNIST's
    files have the same names, in FashionMNIST/raw)."""
    rng = np.random.default_rng(seed)
    raw = Path(root) / folder
    raw.mkdir(parents=True, exist_ok=True)
    out = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = np.zeros((n, 28, 28), np.uint8)
        for img in images:
            r, c = rng.integers(6, 22, size=2)
            img[r - 4:r + 4, c - 2:c + 2] = rng.integers(128, 256)
        labels = rng.integers(0, 10, size=n).astype(np.uint8)
        for kind, arr in (("images-idx3", images), ("labels-idx1", labels)):
            name = f"{prefix}-{kind}-ubyte"
            data = idx_bytes(arr)
            if gz:
                (raw / (name + ".gz")).write_bytes(gzip.compress(data))
            else:
                (raw / name).write_bytes(data)
        out[prefix] = (images, labels)
    return out


def write_cifar(root, batches=("data_batch_1", "test_batch"), n=12, seed=0):
    """Random CIFAR-10 python batches (channel-planar N x 3072 uint8) in <root>/cifar-10-batches-py."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in batches:
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n).tolist()
        with open(folder / name, "wb") as f:
            pickle.dump({"data": data, "labels": labels, "filenames": [f"{i}.png" for i in range(n)]}, f, protocol=4)
        out[name] = (data, labels)
    return out


def py2_cifar_pickle(data, labels, key="labels", coarse=None):
    """A CIFAR-10 batch pickled as the official files are (Python 2, protocol 2: numpy.core.multiarray
    names, the pixels as a py2 str), assembled opcode by opcode since Python 3 cannot write one.
    CIFAR-100's: key="fine_labels" and coarse, the coarse labels."""
    def s(text):  # SHORT_BINSTRING
        return b"U" + bytes([len(text)]) + text.encode()

    def i(n):  # BININT
        return b"J" + int(n).to_bytes(4, "little", signed=True)

    raw = np.ascontiguousarray(data, np.uint8).tobytes()
    dtype = b"cnumpy\ndtype\n" + s("u1") + i(0) + i(1) + b"\x87R" \
        + b"(" + i(3) + s("|") + b"NNN" + i(-1) + i(-1) + i(0) + b"tb"
    array = b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n" + i(0) + b"\x85" + s("b") + b"\x87R" \
        + b"(" + i(1) + i(data.shape[0]) + i(data.shape[1]) + b"\x86" + dtype + b"\x89" \
        + b"T" + len(raw).to_bytes(4, "little") + raw + b"tb"
    items = s("batch_label") + s("testing batch 1 of 1") + s(key) + b"](" + b"".join(i(v) for v in labels) + b"e" \
        + (s("coarse_labels") + b"](" + b"".join(i(v) for v in coarse) + b"e" if coarse is not None else b"") \
        + s("data") + array + s("filenames") + b"](" + b"".join(s(f"{k}.png") for k in range(len(labels))) + b"e"
    return b"\x80\x02}(" + items + b"u."


def write_cifar100(root, n_train=10, n_test=4, seed=0):
    """cifar-100-python/{train,test} pickled as the official files are (py2_cifar_pickle, fine and coarse
    labels) and its meta (fine_label_names, coarse_label_names) under root; returns {file: (data, fine)}."""
    from imagegen.data.catalogue import CIFAR100_CLASSES
    rng = np.random.default_rng(seed)
    folder = Path(root) / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, n in (("train", n_train), ("test", n_test)):
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        fine = rng.integers(0, 100, size=n).tolist()
        (folder / name).write_bytes(py2_cifar_pickle(data, fine, key="fine_labels", coarse=[v // 5 for v in fine]))
        out[name] = (data, fine)
    meta = {"fine_label_names": list(CIFAR100_CLASSES), "coarse_label_names": [f"super{k}" for k in range(20)]}
    (folder / "meta").write_bytes(pickle.dumps(meta, protocol=2))
    return out


class Payload:
    """Unpickling this runs os.system(command): the hostile object a data file must never get to run."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        import os
        return os.system, (self.command,)


def hostile_cifar_pickle(marker, protocol=4):
    """An otherwise valid CIFAR-10 batch with a payload (in 'filenames', before 'data') that would
    create marker."""
    data = np.zeros((2, 3072), np.uint8)
    return pickle.dumps({"filenames": Payload(f"touch {marker}"), "data": data, "labels": [0, 1]},
                        protocol=protocol)


def one_sentence(excinfo):
    """The message of a raised UserError, checked to be one line ending in a full stop."""
    msg = str(excinfo.value)
    assert "\n" not in msg and msg.endswith(".") and "Traceback" not in msg, msg
    return msg


REQUIRABLE = ("browser", "triton", "kernel", "shared_data")


def ci_requires(what):
    """Whether a test that needs `what` (one of REQUIRABLE) fails rather than skips where it is missing:
    IMAGEGEN_CI_REQUIRE lists what must be there, comma-separated (.ci/run sets all four). The suite's one
    variable of its own; a name not in REQUIRABLE is an error, so that a typo cannot quietly skip."""
    listed = [w.strip() for w in os.environ.get("IMAGEGEN_CI_REQUIRE", "").split(",") if w.strip()]
    unknown = sorted(set(listed) - set(REQUIRABLE))
    if unknown or what not in REQUIRABLE:
        raise ValueError(f"IMAGEGEN_CI_REQUIRE names {unknown or what}; it lists some of {', '.join(REQUIRABLE)}")
    return what in listed


# The real data files of this project's machines: ../shared/data beside the checkout (in CI too).
# Tests that read them fail rather than skip where ci_requires("shared_data").
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def shared_data(*parts):
    """The path of a file under ../shared/data, or a skip (a failure where the data is required)."""
    import pytest      # here, not at the top: .ci/wheel_check.sh imports this module without pytest
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        if ci_requires("shared_data"):
            pytest.fail(f"{path} is missing, and IMAGEGEN_CI_REQUIRE requires the real data")
        pytest.skip(f"the real data files are not on this machine ({path})")
    return path


# ---------------------------------------------------------------- image folders (data=folder)
def solid(mode, size, value):
    """A PIL image of one colour in any mode (16-bit modes take 0..65535)."""
    from PIL import Image
    return Image.new(mode, size, value)


def write_png_header(path, width, height):
    """A PNG whose header promises width x height grey pixels and holds almost none: a decompression
    bomb that Pillow must refuse before decoding."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    Path(path).write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
                           + chunk(b"IEND", b""))


def write_class_folder(root, classes=("cat", "dog"), per_class=3, size=(12, 10), seed=0, suffix=".png"):
    """root/<class>/<i><suffix>: each class a different brightness (class k: 40 + 80 k), so labels can be
    read back from the pixels."""
    from PIL import Image
    rng = np.random.default_rng(seed)
    paths = []
    for k, name in enumerate(classes):
        (Path(root) / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            a = np.full((size[1], size[0], 3), 40 + 80 * k, np.uint8) + rng.integers(0, 3, (size[1], size[0], 3),
                                                                                        dtype=np.uint8)
            path = Path(root) / name / f"{i}{suffix}"
            Image.fromarray(a).save(path)
            paths.append(path)
    return paths


def write_imagenet(root, size=8, batches=(5, 3), n_val=4, seed=0, subfolder="Imagenet_train_npz"):
    """Downsampled-ImageNet npz files (data: N x 3*S*S channel-planar uint8, labels 1..1000 as a list,
    as the official files hold them) under root: train batches in a subfolder, val_data.npz at the top."""
    rng = np.random.default_rng(seed)
    out = {}
    (Path(root) / subfolder).mkdir(parents=True, exist_ok=True)
    names = [f"{subfolder}/train_data_batch_{i + 1}.npz" for i in range(len(batches))] + ["val_data.npz"]
    for name, n in zip(names, list(batches) + [n_val]):
        data = rng.integers(0, 256, (n, 3 * size * size), dtype=np.uint8)
        labels = rng.integers(1, 1001, n).tolist()
        np.savez(Path(root) / name, data=data, labels=labels, mean=np.zeros(3 * size * size))
        out[name] = (data, labels)
    return out


def skip_without_cpu_kernel(why):
    """Skip a test that needs the compiled CPU kernel, or fail it where ci_requires("kernel") (in CI: there
    a kernel that does not build fails the suite instead of hiding behind skips)."""
    import pytest
    if ci_requires("kernel"):
        pytest.fail(f"{why}, and IMAGEGEN_CI_REQUIRE requires it")
    pytest.skip(why)


def tiny_model(attention="linear", length=16, channels=1, width=4, seed=0, **sizes):
    """A PixelTransformer of one layer, d_model 16, 2 heads, d_ff 32 (`sizes` overrides these or sets any
    other constructor argument: head, attention_options, ...), its weights drawn after
    torch.manual_seed(seed): 16 grey subpixels (4 wide) unless length, channels and width say otherwise."""
    torch.manual_seed(seed)
    return PixelTransformer(length, channels, width, attention, **{"n_layers": 1, "d_model": 16, "n_heads": 2,
                                                                   "d_ff": 32, **sizes})


def scaled_model(attention, length=300, impl="auto", seed=0, d_model=64):
    """A small model whose weights are scaled up from the 0.02 init so that its activations and
    distribution parameters are O(1), as in a trained model, rather than near zero."""
    torch.manual_seed(seed)
    options = {"impl": impl} if attention == "linear" else {}
    model = PixelTransformer(length, 1, 20, attention, n_layers=3, d_model=d_model, n_heads=4, d_ff=128, head="mixture",
                             attention_options=options).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("weight") and p.dim() == 2 and not name.startswith(("tok", "row", "col", "chan")):
                p.mul_(4.0)                     # std 0.08 for the Dense layers
    return model


def decode_params(model, x, dtype, whole_model_kernel=True):
    """Distribution parameters (L, N, P) of teacher-forced decoding over x (N, L)."""
    N, L = x.shape
    state = model.init_state(N, torch.device("cpu"), dtype, whole_model_kernel=whole_model_kernel)
    token, out = torch.full((N,), 256), []
    with torch.inference_mode():
        for t in range(L):
            params, state = model.step(token, state)
            out.append(params)
            token = x[:, t]
    return torch.stack(out), state


# ---------------------------------------------------------------- a local mirror (download tests)
class Server:
    """Serves {name: bytes}; mode 'ok', 'corrupt' (one byte changed), 'cut' (closes after half the
    bytes, having promised them all) or 'cut-unsized' (the same without a Content-Length)."""

    def __init__(self, files):
        import http.server
        import threading
        self.files, self.mode, self.requests = files, "ok", []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                name = self.path.rsplit("/", 1)[-1]
                server.requests.append(self.path)
                if name not in server.files:
                    self.send_error(404)
                    return
                body = server.files[name]
                if server.mode == "corrupt":
                    body = body[:-1] + bytes([body[-1] ^ 1])
                self.send_response(200)
                if server.mode != "cut-unsized":
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2] if server.mode.startswith("cut") else body)
                self.close_connection = True

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/mirror/"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def md5(b):
    import hashlib
    return hashlib.md5(b).hexdigest()


def official_md5s(monkeypatch, files, *names):
    """Patch the md5s of the named sets' official files to those of the fixtures served in their place."""
    from dataclasses import replace
    from imagegen.data.official import OFFICIAL
    for name in names:
        spec = OFFICIAL[name]
        monkeypatch.setitem(OFFICIAL, name, replace(spec, md5={f: md5(files[f]) for f in spec.md5}))


def leftovers(root):
    return sorted(str(p.relative_to(root)) for p in Path(root).rglob("*") if p.is_file())


def refused_by_checksum(server, root, name, split):
    """A download the server corrupts is refused in one sentence by its md5, and nothing is kept."""
    import pytest
    from imagegen.data.splits import load_split
    from imagegen.errors import UserError
    server.mode = "corrupt"
    with pytest.raises(UserError, match="wrong md5 checksum.*nothing was kept") as e:
        load_split(name, root, split, download_missing=True, mirror=server.url)
    one_sentence(e)
    assert leftovers(root) == []


# ---------------------------------------------------------------- checkpoints
def tiny_checkpoint(path, **changes):
    """A real checkpoint of a tiny model, with entries replaced by `changes` (a value of None deletes)."""
    from imagegen.store import checkpoint
    from imagegen.data.sets import dataset_info
    from imagegen.model.transformer import build_model
    cfg = {"model": {"attention": "linear", "n_layers": 1, "d_model": 8, "n_heads": 2, "d_ff": 16,
                     "head": "categorical", "n_mixtures": 2, "dropout": 0.0, "attention_options": {}},
           "data": {"name": "mnist", "root": "/nonexistent", "download": False, "val_fraction": 0.05,
                    "split_seed": 0}}
    payload = {"config": cfg, "model": build_model(cfg["model"], dataset_info("mnist")).state_dict()}
    for key, value in changes.items():
        if value is None:
            payload.pop(key)
        else:
            payload[key] = value(payload) if callable(value) else value
    checkpoint.save(path, payload)
    return path


# ---------------------------------------------------------------- attention inputs (ops, triton)
def make_qkv(N, H, L, E, M, dtype=torch.float64, device="cpu", seed=0):
    """Non-negative q, k (as after a feature map) and signed v."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.rand(N, H, L, E, generator=gen, dtype=torch.float64)
    k = torch.rand(N, H, L, E, generator=gen, dtype=torch.float64)
    v = torch.randn(N, H, L, M, generator=gen, dtype=torch.float64)
    return tuple(t.to(device, dtype) for t in (q, k, v))


def make_raw_qkv(*shape, seed=0):
    """Signed q, k spread over both branches of phi (elu's exp side and the linear side)."""
    q, k, v = make_qkv(*shape, seed=seed)
    return 6 * q - 4, 6 * k - 3, v


# the causal product's shapes that tests/test_ops.py and tests/test_ops_cuda.py check
SHAPES = [  # N, H, L, E, M
    (1, 1, 1, 1, 1),
    (2, 3, 17, 5, 7),      # odd length, E != M
    (1, 2, 65, 8, 3),      # one past the default chunk
    (2, 1, 130, 16, 33),   # M + 1 as in causal_linear_attention
    (1, 2, 197, 4, 6),     # the fused backward's groups of 4 steps, the last one partial
    (1, 1, 9, 128, 2),
    (1, 1, 11, 1, 128),
    (1, 2, 0, 4, 4),       # empty sequence
]


def assert_close_all(got, want, **tol):
    for name, a, b in zip(("out", "grad_q", "grad_k", "grad_v"), got, want):
        torch.testing.assert_close(a.double(), b.double(), msg=lambda m: f"{name}: {m}", **tol)


def out_and_grads(fn, q, k, v, grad_seed=1):
    """fn(q, k, v) and the gradients of <fn(q, k, v), G> for a fixed random G."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    gen = torch.Generator().manual_seed(grad_seed)
    g = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out.device, out.dtype)
    return (out.detach(), *torch.autograd.grad(out, leaves, g, allow_unused=True))


def mnist_best_pt(tmp_path, mnist_root, model_cfg, ema_noise=0.0):
    """(path, ema): a best.pt as imagegen-train writes it of a (random) MNIST model `model_cfg` with an
    averaged copy of its weights (the one a conversion takes), moved by ema_noise x N(0, 1) when given."""
    from imagegen.data.catalogue import DATASETS
    from imagegen.model.transformer import build_model
    from imagegen.store import checkpoint
    torch.manual_seed(0)
    model, ema = build_model(model_cfg, DATASETS["mnist"]), build_model(model_cfg, DATASETS["mnist"])
    with torch.no_grad():
        for p in ema.parameters():
            p.add_(torch.randn_like(p) * ema_noise)
    data = {"name": "mnist", "root": str(mnist_root), "download": False, "mirror": None, "val_fraction": 0.05,
            "split_seed": 0}
    config = {"model": model_cfg, "data": data, "train": {"lr": 1e-3}}
    path = tmp_path / "run" / "best.pt"
    checkpoint.save(path, {"config": config, "model": model.state_dict(), "ema": ema.state_dict(),
                           "state": {"step": 7, "elapsed": 90.0, "epoch": 0, "seen": 0, "best_val": 5.0}})
    return path, ema


def convert_cfg(path, out, mnist_root, check_images=4, guidance=2.0, precision="float32"):
    """imagegen-convert's config for checkpoint `path` -> OUT, its check on mnist_root's test digits."""
    return {"checkpoint": str(path), "out": str(out), "guidance": guidance, "check_images": check_images,
            "batch_size": 8, "device": "cpu", "threads": 0, "progress": False, "precision": precision,
            "data": {"root": str(mnist_root), "download": None, "mirror": None}}


def assert_shipped_files_small(name, max_mb):
    """The shipped model `name` has its .safetensors, .json and .md in checkpoints/, each at most max_mb
    MB, and is listed among the shipped names."""
    from imagegen.store import shipped
    for suffix in (".safetensors", ".json", ".md"):
        path = shipped.SHIPPED / f"{name}{suffix}"
        assert path.is_file(), f"{path} is missing"
        assert path.stat().st_size <= max_mb * 2 ** 20, f"{path} is over {max_mb} MB"
    assert name in shipped.names()


def assert_same_training(a, b):
    """The runs in folders a and b end at the same step with bit-identical weights and optimizer moments."""
    ca, cb = (torch.load(d / "last.pt", weights_only=True) for d in (a, b))
    assert ca["state"]["step"] == cb["state"]["step"]
    for name, t in ca["model"].items():
        assert torch.equal(t, cb["model"][name]), name
    for (i, sa), (_, sb) in zip(ca["optimizer"]["state"].items(), cb["optimizer"]["state"].items()):
        for key in sa:
            assert torch.equal(torch.as_tensor(sa[key]), torch.as_tensor(sb[key])), (i, key)
