"""threads=0 for the step sampler: the faster of torch's default thread count and one, measured."""
import pytest
import torch

from fixtures import tiny_model
from imagegen.sampling import threads
from imagegen.tuning.choice import Choice


@pytest.fixture(autouse=True)
def probes_on(monkeypatch):
    monkeypatch.setenv("IMAGEGEN_PROBE", "1")        # conftest turns measured choices off for the other tests


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def tiny():
    return tiny_model("linear").eval()


@pytest.mark.parametrize("two, one, want", [(0.040, 0.002, 1), (0.002, 0.004, 2)])
def test_the_faster_thread_count_is_kept_and_said(monkeypatch, two_threads, two, one, want):
    monkeypatch.setattr(threads, "step_seconds", lambda model, batch, dtype, n: one if n == 1 else two)
    chosen, line = threads.choose_threads(tiny(), 8)
    assert chosen == want == torch.get_num_threads()
    assert f"{two * 1e3:.1f} ms with 2 threads, {one * 1e3:.1f} ms with 1" in line and "threads=N sets it" in line


def test_a_real_measurement_restores_the_thread_count(two_threads):
    seconds = threads.step_seconds(tiny(), 3, None, 1)
    assert seconds > 0 and torch.get_num_threads() == 2


def test_one_thread_machines_measure_nothing(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr(threads, "step_seconds", lambda *a: pytest.fail("measured on a 1-thread machine"))
    assert threads.choose_threads(tiny(), 8) == (1, None)       # nothing measured, nothing to say


def test_sample_says_its_thread_count_once_in_short_lines(tmp_path, monkeypatch, two_threads):
    """With one core free, fit_threads said "1 thread, as 0 of 2 cores are free" and the sampler then said
    "1 thread" again; the summary after was one line of 300 characters."""
    from commands import call
    from imagegen import api
    from imagegen.tuning import threads as fit
    monkeypatch.setattr(fit, "free_cores", lambda: 0)            # the other core busy
    monkeypatch.setattr(fit, "DEFAULT", 2)
    monkeypatch.setattr(fit, "_said", set())
    monkeypatch.setattr(api, "generate", lambda model, n, **kw: torch.zeros(n, 784, dtype=torch.uint8))
    monkeypatch.setattr(api, "decide_precision", lambda *a, **kw: Choice(torch.float32, "a long reason " * 20))
    proc = call("imagegen-sample", "nrow=2", "progress=false", f"out={tmp_path / 'x.png'}")
    assert proc.returncode == 0, proc.stderr
    lines = (proc.stdout + proc.stderr).splitlines()
    assert len([line for line in lines if "threads=0" in line]) == 1, lines
    assert all(len(line) <= 120 for line in lines), lines
    assert "a long reason" in proc.stdout


def test_a_batch_that_cannot_fit_is_refused_before_measuring(monkeypatch):
    from imagegen.errors import UserError
    monkeypatch.setattr(threads, "step_seconds", lambda *a: pytest.fail("measured a batch that cannot fit"))
    model = tiny_model("softmax").eval()
    with pytest.raises(UserError, match="lower batch_size"):
        threads.choose_threads(model, 10 ** 12)


def test_probes_off_keep_the_default(monkeypatch, two_threads):
    monkeypatch.setenv("IMAGEGEN_PROBE", "0")
    monkeypatch.setattr(threads, "step_seconds", lambda *a: pytest.fail("measured with probes off"))
    chosen, line = threads.choose_threads(tiny(), 8)
    assert chosen == 2 and "IMAGEGEN_PROBE=0: not measured" in line
