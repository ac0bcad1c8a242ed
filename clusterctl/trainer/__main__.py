"""`python -m clusterctl.trainer`: the reference trainer as a job's command.

Under clusterctl the batch sizes, sequence length and model shape come from
the job spec (run.json); the flags override them, and a plain torchrun or
env:// launch works with flags alone.
"""

from __future__ import annotations

import argparse
import dataclasses

from clusterctl.trainer.loop import TrainConfig, train
from clusterctl.trainer.settings import run_settings


def config_from(argv: list[str] | None = None) -> TrainConfig:
    run = run_settings()
    base = TrainConfig()
    if run is not None:
        model = run.model or {}
        base = dataclasses.replace(
            base,
            micro=run.batch.micro,
            grad_accum=run.batch.grad_accum,
            seq_len=run.seq_len,
            layers=model.get("layers") or base.layers,
            hidden=model.get("hidden") or base.hidden,
            heads=model.get("heads") or base.heads,
            ffn=model.get("ffn") or base.ffn,
            vocab=model.get("vocab") or base.vocab,
        )
    parser = argparse.ArgumentParser(prog="python -m clusterctl.trainer", description=__doc__.splitlines()[0])
    for f in dataclasses.fields(TrainConfig):
        if f.name == "extra":
            continue
        flag = "--" + f.name.replace("_", "-")
        default = getattr(base, f.name)
        if f.type in ("bool", bool):
            parser.add_argument(flag, action="store_true", default=default)
        elif f.name == "target_loss":
            parser.add_argument(flag, type=float, default=default)
        elif f.name in ("checkpoint_dir", "out_dir", "data_dir"):
            parser.add_argument(flag, type=str, default=default)
        elif f.name == "checkpoint_interval":
            parser.add_argument(flag, type=int, default=default)
        else:
            parser.add_argument(flag, type=type(default), default=default)
    args = parser.parse_args(argv)
    return TrainConfig(**{k: v for k, v in vars(args).items()})


def main() -> None:
    train(config_from())


if __name__ == "__main__":
    main()
