"""threads=0 for the step sampler: the faster of torch's default thread count and one, measured."""
import pytest
import torch

from fixtures import tiny_model
from imagegen.sampling import threads


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
    assert threads.choose_threads(tiny(), 8)[0] == 1


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
