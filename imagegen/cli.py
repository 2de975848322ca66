"""What every entry point shares: Hydra wiring, config-name checks, devices, one-line errors."""
import sys

import torch

from .errors import UserError
from .paths import data_dir

CONF_DIR = data_dir("conf")  # shipped inside the package by a wheel, else the source tree's


def check_choices(argv, groups):
    """Reject unknown config-group choices (model=..., data=..., preset=...) before Hydra does."""
    for arg in argv:
        key, _, value = arg.lstrip("+~").partition("=")
        if key in groups and value:
            valid = sorted(p.stem for p in (CONF_DIR / key).glob("*.yaml"))
            if value not in valid:
                raise UserError(f"unknown {key} {value!r}; choose one of: {', '.join(valid)}.")


def hydra_entry(config_name, task, groups=()):
    """A console-script main() running `task(cfg, device)` under Hydra, cfg a plain dict with
    `device` and `threads` keys, printing UserErrors as one line."""
    import hydra
    from omegaconf import OmegaConf

    def main():
        try:
            check_choices(sys.argv[1:], groups)
        except UserError as e:
            sys.exit(f"error: {e}")

        @hydra.main(config_path=str(CONF_DIR), config_name=config_name, version_base="1.3")
        def run(cfg):
            try:
                plain = OmegaConf.to_container(cfg, resolve=True)
                task(plain, resolve_device(plain["device"], plain["threads"]))
            except UserError as e:
                sys.exit(f"error: {e}")
            except KeyboardInterrupt:
                sys.exit("interrupted")
        run()
    return main


def resolve_device(name="auto", threads=0):
    if threads:
        torch.set_num_threads(int(threads))
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if str(name).startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device={name} asked for, but this torch build sees no CUDA GPU; use device=cpu or device=auto.")
    try:
        return torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N.") from None
