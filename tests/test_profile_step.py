"""The training-step profile (python -m tools.profile_step): a preset's architecture,
every operator of a step counted once in its group, and one sentence for an unknown preset."""
import json

import pytest

from tools import profile_step


def test_preset_architecture_over_the_typed_defaults():
    cfg = profile_step.model_config("paper_mnist", "linear")
    assert (cfg["n_layers"], cfg["d_model"], cfg["head"]) == (8, 256, "mixture")
    assert cfg["attention_options"] == {"impl": "auto"} and "dropout" in cfg        # a default the preset omits
    with pytest.raises(SystemExit, match="no preset 'paper'; choose one of: .*paper_mnist"):
        profile_step.model_config("paper", "linear")


@pytest.mark.parametrize("attention", ["linear", "softmax"])
def test_rows_cover_the_step_and_name_their_groups(tmp_path, capsys, monkeypatch, attention):
    tiny = {**profile_step.model_config("small", attention), "n_layers": 1, "d_model": 16, "n_heads": 2, "d_ff": 32}
    monkeypatch.setattr(profile_step, "model_config", lambda preset, attention: tiny)
    out = tmp_path / "profile.json"
    profile_step.main(["--batch", "2", "--steps", "1", "--attention", attention, "--json", str(out)])
    result = json.loads(out.read_text())
    assert sum(r["share"] for r in result["rows"]) == pytest.approx(1.0)
    assert sum(result["shares"].values()) == pytest.approx(1.0) and result["shares"]["products"] > 0
    assert {"aten::addmm", "aten::mm"} & {r["name"] for r in result["rows"] if r["group"] == "products"}
    assert result["shares"]["attention"] > 0          # the fused linear kernel, or torch's softmax attention
    assert "matrix products" in capsys.readouterr().out
