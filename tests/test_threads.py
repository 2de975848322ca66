"""torch's thread count fitted to the cores free now (imagegen/tuning/threads.py): the count from /proc/stat,
fit_threads' rules, and the trainer's watch dropping threads when its steps slow down. Nothing is
timed: /proc/stat, the clock and the free-core count are mocked."""
import pytest
import torch

from imagegen.tuning import threads
from imagegen.errors import UserError

CORES = threads.cores                                    # the real one (the fixture below replaces it)

STAT = """cpu  {a} 0 0 {b} 0 0 0 0 0 0
cpu0 {busy0} 0 0 {idle0} 0 0 0 0 0 0
cpu1 {busy1} 0 0 {idle1} {iowait1} 0 0 0 0 0
intr 1 2 3
"""


def stat(busy0, idle0, busy1, idle1, iowait1=0):
    return STAT.format(a=busy0 + busy1, b=idle0 + idle1, busy0=busy0, idle0=idle0, busy1=busy1, idle1=idle1,
                       iowait1=iowait1)


@pytest.fixture(autouse=True)
def keep_threads(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "_said", set())
    monkeypatch.setattr(threads, "cores", lambda: 64)    # counts below fit any machine (the cap's tests set their own)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def probes_on(monkeypatch):
    monkeypatch.setenv("IMAGEGEN_PROBE", "1")


def reader(*texts, tmp_path):
    """read() returning read_stat of each text in turn (written to a file, as /proc/stat is read)."""
    files = []
    for i, text in enumerate(texts):
        path = tmp_path / f"stat{i}"
        path.write_text(text)
        files.append(path)
    calls = iter(files)
    return lambda: threads.read_stat(next(calls))


@pytest.mark.parametrize("after, free", [       # from 100 busy and 100 idle ticks on each core, 40 ticks on
    (stat(100, 140, 100, 140), 2),            # both cores idle over the interval
    (stat(140, 100, 100, 140), 1),            # core 0 busy (a training run), core 1 idle
    (stat(140, 100, 140, 100), 0),            # both busy
    (stat(140, 100, 108, 112, 20), 1),        # iowait counts as idle: 0.8 of core 1 idle is a free core
    (stat(140, 100, 112, 128), 0),            # 0.7 of a core idle is not
    (stat(120, 120, 120, 120), 1),            # half of each idle: 1.0 cores' worth
    (stat(110, 130, 120, 120), 1),            # 0.75 + 0.5 = 1.25 cores idle
    (stat(104, 136, 104, 136), 2),            # 1.8 cores idle
])
def test_free_cores_from_proc_stat(tmp_path, after, free):
    read = reader(stat(100, 100, 100, 100), after, tmp_path=tmp_path)
    slept = []
    assert threads.free_cores(read=read, sleep=slept.append, cpus=[0, 1]) == free
    assert slept == [threads.INTERVAL]


def test_free_cores_counts_only_our_cores(tmp_path):
    read = reader(stat(100, 100, 100, 100), stat(100, 140, 100, 140), tmp_path=tmp_path)
    assert threads.free_cores(read=read, sleep=lambda s: None, cpus=[1]) == 1


def test_free_cores_without_proc_stat(tmp_path):
    assert threads.read_stat(tmp_path / "absent") == {}
    assert threads.free_cores(read=lambda: {}, sleep=lambda s: pytest.fail("slept")) is None


def test_threads_zero_follows_the_free_cores(monkeypatch, probes_on):
    monkeypatch.setattr(threads, "DEFAULT", 2)
    said = []
    assert threads.fit_threads(0, measure=lambda: 1, tell=said.append) == 1
    assert torch.get_num_threads() == 1
    assert len(said) == 1 and said[0].startswith("threads=0: 1 thread, as 1 of") and "threads=N" in said[0]
    assert threads.fit_threads(0, measure=lambda: 0, tell=said.append) == 1          # never below 1
    assert threads.fit_threads(0, measure=lambda: 2, tell=said.append) == 2
    assert threads.fit_threads(0, measure=lambda: 8, tell=said.append) == 2          # never above torch's default
    assert torch.get_num_threads() == 2
    assert len(said) == 2                                     # one line for 1 free, one for 0; none at 2 or 8


def test_threads_zero_shares_the_cores_under_torchrun(monkeypatch, probes_on):
    monkeypatch.setattr(threads, "DEFAULT", 8)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert threads.fit_threads(0, measure=lambda: 6, tell=lambda line: None) == 3
    assert threads.fit_threads(0, measure=lambda: 1, tell=lambda line: None) == 1


def test_explicit_threads_beyond_the_free_cores_say_so_once_and_are_kept(probes_on):
    said = []
    for _ in range(3):
        assert threads.fit_threads(2, measure=lambda: 1, tell=said.append) == 2
        assert torch.get_num_threads() == 2
    assert len(said) == 1 and said[0].startswith("threads=2, but 1 of") and "threads=0" in said[0]
    assert threads.fit_threads(1, measure=lambda: 1, tell=said.append) == 1 and len(said) == 1   # fits: silent
    assert threads.fit_threads(1, measure=lambda: 0, tell=said.append) == 1 and len(said) == 1   # 1 is the least


def test_probes_off_follow_the_rule_and_measure_nothing(monkeypatch):
    monkeypatch.setenv("IMAGEGEN_PROBE", "0")
    torch.set_num_threads(2)

    def measure():
        raise AssertionError("measured with IMAGEGEN_PROBE=0")
    said = []
    assert threads.fit_threads(0, measure=measure, tell=said.append) == 2       # torch's count, untouched
    assert threads.fit_threads(1, measure=measure, tell=said.append) == 1
    assert torch.get_num_threads() == 1 and said == []
    with pytest.raises(UserError, match="threads must be >= 0"):
        threads.fit_threads(-1, measure=measure)


def test_commands_fit_threads_at_start(monkeypatch, probes_on):
    from imagegen.commands.cli import resolve_device
    monkeypatch.setattr(threads, "DEFAULT", 2)
    monkeypatch.setattr(threads, "free_cores", lambda: 1)
    torch.set_num_threads(2)
    assert resolve_device("cpu", 0).type == "cpu" and torch.get_num_threads() == 1
    assert resolve_device("cpu", 2).type == "cpu" and torch.get_num_threads() == 2


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_the_watch_drops_threads_when_steps_slow_down():
    torch.set_num_threads(2)
    clock, looks, said = Clock(), [], []

    def measure():
        looks.append(clock.now)
        return 1
    watch = threads.Watch(window=5, slowdown=2.0, every=180, measure=measure, clock=clock, tell=said.append)
    for t in [0.10, 0.11, 0.09, 0.10, 0.10] * 2:        # two windows at the best pace
        assert watch.step(t) is None
    for t in [0.15] * 5:                                 # 1.5x the best: not a sharp slowdown
        assert watch.step(t) is None
    clock.now = 100.0
    for t in [0.5] * 5:                                  # 5x, but the last look (the start) is under 180 s old
        assert watch.step(t) is None
    assert looks == [] and torch.get_num_threads() == 2
    clock.now = 200.0
    lines = [watch.step(t) for t in [0.5] * 5]
    assert lines[:4] == [None] * 4 and lines[4] is not None
    assert looks == [200.0] and torch.get_num_threads() == 1
    assert said == [lines[4]] and "torch threads 2 -> 1" in said[0] and "500 ms (best 100 ms)" in said[0]
    clock.now = 500.0                                    # at one thread its own pace is the new best
    for t in [0.2] * 10:
        assert watch.step(t) is None
    assert looks == [200.0]


def test_the_watch_keeps_threads_when_the_cores_are_free():
    torch.set_num_threads(2)
    clock, said = Clock(), []
    watch = threads.Watch(window=2, every=180, measure=lambda: 2, clock=clock, tell=said.append)
    for t in [0.1, 0.1]:
        watch.step(t)
    clock.now = 1000.0
    for t in [0.5, 0.5, 0.5, 0.5]:
        assert watch.step(t) is None
    assert torch.get_num_threads() == 2 and said == []
    assert watch.last_look == 1000.0                     # it did look, once (the second slow window is too soon)


def test_the_python_api_fits_threads_at_load_and_looks_again_later(monkeypatch, probes_on):
    import imagegen
    monkeypatch.setattr(threads, "DEFAULT", 2)
    looks = []
    monkeypatch.setattr(threads, "free_cores", lambda: looks.append(1) or 1)
    torch.set_num_threads(2)
    model = imagegen.load("mnist-linear")
    assert torch.get_num_threads() == 1 and len(looks) == 1
    model._fit_threads()                                   # a method soon after: no new look
    assert len(looks) == 1
    model._looked -= threads.LOOK_SECONDS                  # minutes later: one more look
    model._fit_threads()
    assert len(looks) == 2
    torch.set_num_threads(2)
    imagegen.load("mnist-linear", threads=None)            # None: torch's count left alone, nothing measured
    assert torch.get_num_threads() == 2 and len(looks) == 2
    fixed = imagegen.load("mnist-linear", threads=2)       # N: kept, said once (measured at load only)
    torch.set_num_threads(1)
    fixed._fit_threads()
    assert torch.get_num_threads() == 2 and len(looks) == 3


# ---------------------------------------------------------------- counts past the cores, negative counts (issue 45)
def test_threads_past_the_cores_are_capped_in_one_line_once(monkeypatch, probes_on):
    """threads=10000: train and sample died in libgomp ("Thread creation failed"), eval held 21 GB."""
    monkeypatch.setattr(threads, "cores", lambda: 2)
    said = []
    for _ in range(3):
        assert threads.fit_threads(10000, measure=lambda: 1, tell=said.append) == 2
        assert torch.get_num_threads() == 2
    assert said == ["threads=10000, but this process may run on 2 cores: 2 threads (more would only wait for "
                    "each other)"]
    assert threads.fit_threads(2, measure=lambda: 2, tell=said.append) == 2 and len(said) == 1   # at the cores: silent


def test_the_cap_holds_without_probes_and_on_the_real_machine(monkeypatch):
    monkeypatch.setenv("IMAGEGEN_PROBE", "0")
    monkeypatch.setattr(threads, "cores", CORES)         # this machine's own count
    assert threads.fit_threads(10000, tell=lambda line: None) == len(threads.allowed_cpus())
    assert torch.get_num_threads() == len(threads.allowed_cpus())


@pytest.mark.parametrize("bad", [-1, 2.5, True, "2"])
def test_threads_that_are_not_a_count_are_one_sentence(bad):
    with pytest.raises(UserError, match=f"threads must be >= 0 .*got {bad!r}"):
        threads.fit_threads(bad)


def test_every_command_and_the_api_cap_threads(monkeypatch, tmp_path):
    """The cap sits where every command (commands/cli.resolve_device) and load(threads=N) set the count."""
    import imagegen
    from commands import call
    from imagegen import api
    monkeypatch.setattr(threads, "cores", lambda: 1)
    seen = []
    monkeypatch.setattr(api, "generate", lambda model, n, **kw: seen.append(torch.get_num_threads())
                        or torch.zeros(n, 784, dtype=torch.uint8))
    proc = call("imagegen-sample", "threads=10000", "num_images=1", "labels=none", "scale=1",
                f"out={tmp_path / 'x.png'}")
    assert proc.returncode == 0 and seen == [1], proc.stderr
    assert "threads=10000, but this process may run on 1 core: 1 thread" in proc.stderr
    model = imagegen.load("mnist-linear", threads=10000)
    torch.set_num_threads(2)
    model._fit_threads()
    assert model.threads == 1 and torch.get_num_threads() == 1
    with pytest.raises(UserError, match="threads must be >= 0"):
        imagegen.load("mnist-linear", threads=-1)
