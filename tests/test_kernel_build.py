"""The kernel build: hashed build folders, a lock that dies with its process, messages.

The locking logic (`locked_build`) is tested with small build callables in subprocesses, so a
holder can be killed or kept busy; one slow test does it all with the real kernel (one real
compile, about a minute here): a first build killed with SIGKILL mid-compile, the next command
compiling at once, a concurrent one waiting and then reusing its result, and a later one
loading silently.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from imagegen.ops import build as kernel_mod
from imagegen.ops.build import build_key, locked_build

ROOT = Path(__file__).resolve().parents[1]
needs_flock = pytest.mark.skipif(kernel_mod.fcntl is None, reason="no fcntl (Windows): builds are not locked")

# A build in a subprocess: `build()` creates torch's lock file as cpp_extension.load does, sleeps,
# then writes the "module"; `load()` reads it. argv: build_dir, seconds to sleep, text to write.
HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from imagegen.ops.build import locked_build
    d, seconds, text = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    def build():
        (d / "lock").touch()
        time.sleep(seconds)
        (d / "module").write_text(text)
        (d / "lock").unlink()
        return text
    print(locked_build(d, build, lambda: (d / "module").read_text(), what="a test build"), flush=True)
""")


def env(**extra):
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def start(args, log, **extra_env):
    """A subprocess in its own session (so its compiler children can be killed with it), stderr to `log`."""
    return subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=open(log, "w"), text=True,
                            env=env(**extra_env), cwd=ROOT, start_new_session=True)


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def test_build_key_follows_sources_flags_and_names(tmp_path):
    a, b = tmp_path / "a.cpp", tmp_path / "b.h"
    a.write_text("int f() { return 1; }\n")
    b.write_text("// header\n")
    key = build_key([a, b], "c++", ["-O3"])
    assert len(key) == 12 and key == build_key([a, b], "c++", ["-O3"])
    assert build_key([a, b], "c++", ["-O2"]) != key          # flags
    assert build_key([a, b], "clang++", ["-O3"]) != key      # compiler
    b.write_text("// header, edited\n")
    assert build_key([a, b], "c++", ["-O3"]) != key          # an included header's contents


def test_checkouts_with_different_sources_build_in_different_folders(tmp_path, monkeypatch):
    """_build names its folder by the sources' hash: an edited copy of csrc/ gets another folder."""
    seen = []
    monkeypatch.setattr(kernel_mod, "locked_build", lambda build_dir, *a, **k: seen.append(build_dir))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.delenv("IMAGEGEN_DISABLE_KERNEL", raising=False)
    copy = tmp_path / "csrc"
    copy.mkdir()
    for f in kernel_mod.SOURCES["cpu"] + kernel_mod.HEADERS:
        (copy / f).write_bytes((kernel_mod.CSRC / f).read_bytes())
    for csrc in (kernel_mod.CSRC, copy):
        monkeypatch.setattr(kernel_mod, "CSRC", csrc)
        kernel_mod._build("cpu")
    (copy / "qkv_checks.h").write_text((copy / "qkv_checks.h").read_text() + "// another checkout\n")
    kernel_mod._build("cpu")
    assert [d.parent for d in seen] == [tmp_path / "ext"] * 3
    assert seen[0].name.startswith("imagegen_causal_product_cpu_")
    assert seen[0] == seen[1] and seen[2] != seen[0]   # same sources, same folder; edited, another


def test_finished_build_is_loaded_silently(tmp_path, capfd):
    (tmp_path / "done").write_text("built\n")
    assert locked_build(tmp_path, build=lambda: pytest.fail("rebuilt"), load=lambda: "module", what="x") == "module"
    assert capfd.readouterr().err == ""


def test_build_says_what_it_does_and_marks_it_done(tmp_path, capfd):
    d = tmp_path / "build"
    assert locked_build(d, build=lambda: "module", load=lambda: pytest.fail("loaded"), what="the thing") == "module"
    err = capfd.readouterr().err.splitlines()
    assert err[0] == "imagegen: compiling the thing (first use, about a minute) ..."
    assert err[1].startswith("imagegen: compiling the thing done in ") and err[1].endswith(" s")
    assert (d / "done").is_file()


def test_failed_build_says_so_and_is_not_marked_done(tmp_path, capfd):
    def build():
        raise RuntimeError("compiler error")
    with pytest.raises(RuntimeError, match="compiler error"):
        locked_build(tmp_path, build, load=lambda: None, what="the thing")
    assert "compiling the thing failed after" in capfd.readouterr().err
    assert not (tmp_path / "done").exists()


@contextmanager
def holder(d, seconds, text, log):
    """A HOLDER process building into d, yielded once it holds the build; killed on leaving if still alive."""
    proc = start(["-c", HOLDER, str(d), str(seconds), text], log)
    try:
        wait_for(lambda: (d / "lock").exists(), 60, "the holder to start building")
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.slow
@needs_flock
def test_killed_builder_leaves_no_lock_that_stops_the_next(tmp_path, capfd):
    d = tmp_path / "build"
    with holder(d, 600, "never", tmp_path / "holder.log") as proc:
        os.killpg(proc.pid, signal.SIGKILL)
    assert (d / "lock").exists()                     # torch's lock file, left behind
    assert locked_build(d, build=lambda: "rebuilt", load=lambda: pytest.fail("loaded"), what="it") == "rebuilt"
    err = capfd.readouterr().err                     # the dead builder's lock removed at once, never waited on
    assert "removing torch's build lock" in err and "waiting" not in err
    assert not (d / "lock").exists()


@pytest.mark.slow
@needs_flock
def test_concurrent_build_waits_saying_so_then_reuses(tmp_path, capfd):
    d = tmp_path / "build"
    with holder(d, 3, "the holder's module", tmp_path / "holder.log") as proc:
        got = locked_build(d, build=lambda: pytest.fail("built twice"), load=lambda: (d / "module").read_text(),
                           what="it")
        assert proc.wait(timeout=60) == 0
    assert got == "the holder's module"
    assert capfd.readouterr().err.splitlines() == [
        f"imagegen: waiting for process {proc.pid}, which is compiling it in {d} ..."]


KERNEL_CHECK = textwrap.dedent("""
    import torch
    from imagegen.ops.kernel import causal_product_kernel
    from imagegen.ops.causal_linear import causal_product_reference
    q, k = torch.rand(1, 2, 9, 4, dtype=torch.float64), torch.rand(1, 2, 9, 4, dtype=torch.float64)
    v = torch.randn(1, 2, 9, 3, dtype=torch.float64)
    torch.testing.assert_close(causal_product_kernel(q, k, v), causal_product_reference(q, k, v))
    print("kernel ok", flush=True)
""")


@needs_flock
@pytest.mark.slow
def test_real_kernel_build_killed_concurrent_and_reused(tmp_path):
    """One real compile: killed mid-compile, then built at once by the next process while a third
    waits and reuses it; a fourth loads it silently."""
    ext = tmp_path / "ext"
    run = dict(TORCH_EXTENSIONS_DIR=str(ext), IMAGEGEN_DISABLE_KERNEL="0", OMP_NUM_THREADS="1")
    logs = [tmp_path / f"p{i}.log" for i in range(4)]
    text = [lambda i=i: logs[i].read_text() for i in range(4)]
    procs = []
    try:
        first = start(["-c", KERNEL_CHECK], logs[0], **run)
        procs.append(first)
        wait_for(lambda: list(ext.glob("imagegen_causal_product_cpu_*/lock")), 120,
                 "the first build to take torch's lock")
        time.sleep(1.5)                                  # mid-compile (the compiler runs outside the test's view)
        os.killpg(first.pid, signal.SIGKILL)             # the process and its compiler
        first.wait()
        assert list(ext.glob("imagegen_causal_product_cpu_*/lock")), "torch's lock was not left behind"

        second = start(["-c", KERNEL_CHECK], logs[1], **run)
        procs.append(second)
        wait_for(lambda: "compiling the C++ kernel for cpu" in text[1](), 30, "the next build to start compiling")
        assert "removing torch's build lock" in text[1]()
        third = start(["-c", KERNEL_CHECK], logs[2], **run)
        procs.append(third)
        wait_for(lambda: f"waiting for process {second.pid}" in text[2](), 30, "the concurrent build's waiting line")
        assert second.wait(timeout=480) == 0, text[1]()
        assert third.wait(timeout=60) == 0, text[2]()
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert "compiling the C++ kernel for cpu done in" in text[1]()
    assert "imagegen: compiling" not in text[2]()        # reused the second's build
    for p in (second, third):
        assert p.stdout.read().strip() == "kernel ok"

    fourth = subprocess.run([sys.executable, "-c", KERNEL_CHECK], capture_output=True, text=True,
                            env=env(**run), cwd=ROOT, timeout=120)
    assert fourth.returncode == 0 and fourth.stdout.strip() == "kernel ok", fourth.stderr
    assert "imagegen:" not in fourth.stderr              # reused silently
    assert len(list(ext.iterdir())) == 1                 # one hashed folder


def test_prebuilt_only_never_compiles(tmp_path, monkeypatch):
    """imagegen-sample's switch: with no finished build in the (empty) extension root, the kernel is
    reported unavailable at once, naming how to build it, instead of compiling for a minute."""
    kernel = kernel_mod
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(kernel, "_modules", {})
    monkeypatch.setattr(kernel.switches, "compile", False)
    with pytest.raises(kernel.KernelUnavailable, match="not built yet.*python -m imagegen.ops`"):
        kernel.load_kernel("cpu")
    assert not any(tmp_path.rglob("*.so"))


def test_prebuilt_error_neither_compiles_nor_remembers(tmp_path, monkeypatch):
    """impl=auto's question on CUDA: is the kernel built already? Unbuilt, the answer says so at once and
    is not kept, so that impl=kernel in the same process still builds it."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(kernel_mod, "_modules", {})
    assert "not built yet" in kernel_mod.prebuilt_error("cpu")
    assert kernel_mod._modules == {} and kernel_mod.switches.compile is True
    assert not any(tmp_path.rglob("*.so"))


def test_build_command_builds_or_says_why_and_checks_its_argument():
    """`python -m imagegen.ops [cpu|cuda]`: one line, no runpy warning (which `python -m imagegen.ops.build`,
    a module the package itself imports, would print)."""
    proc = subprocess.run([sys.executable, "-m", "imagegen.ops"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "the cpu kernel is built" in proc.stderr + proc.stdout, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr
    bad = subprocess.run([sys.executable, "-m", "imagegen.ops", "gpu"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "usage: python -m imagegen.ops [cpu|cuda] (got gpu)" in bad.stderr


def test_build_command_help_and_its_error_alone(monkeypatch, capsys):
    """--help printed usage and exited 1; a kernel that cannot be built printed the fallback line (meant for
    commands that then run the chunked form) before its error, though nothing falls back here."""
    import warnings
    kernel_mod.main(["--help"])                               # returns: exit status 0
    assert capsys.readouterr().out.startswith("usage: python -m imagegen.ops [cpu|cuda]\n")
    monkeypatch.setenv("IMAGEGEN_DISABLE_KERNEL", "1")
    monkeypatch.setattr(kernel_mod, "_modules", {})
    monkeypatch.setattr(kernel_mod, "_warned", set())
    with warnings.catch_warnings(record=True) as caught, pytest.raises(SystemExit) as exit_:
        warnings.simplefilter("always")
        kernel_mod.main(["cpu"])
    assert exit_.value.code == "error: the cpu kernel cannot be built: disabled by IMAGEGEN_DISABLE_KERNEL"
    assert not caught and not capsys.readouterr().err
