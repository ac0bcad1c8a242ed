"""A PyTorch Lightning script under clusterctl: the adapter's three lines, and Lightning does the rest.

Lightning takes rank, world and master from clusterctl, reports every
optimizer step with its loss, commits its checkpoints where `clusterctl
checkpoints` lists them, resumes from the newest one after a restart, and on
a pre-timeout stop saves and exits 85 so that the run continues in a new job.
A tiny model on random data, built here: nothing is downloaded.

    STEPS=200        how many optimizer steps
    STEP_S=0.02      extra time each step takes, in seconds
"""

import os
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from clusterctl.integrations.lightning import Clusterctl  # clusterctl


class Regression(L.LightningModule):
    def __init__(self, step_s: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.step_s = step_s

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        time.sleep(self.step_s)  # stands in for a real model's compute
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def main() -> None:
    steps, step_s = int(os.environ.get("STEPS", "200")), float(os.environ.get("STEP_S", "0.02"))
    torch.manual_seed(0)
    x = torch.randn(4096, 32)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=16, shuffle=True)
    cc = Clusterctl()  # clusterctl: checkpoint dir, interval and keep from the job spec
    trainer = L.Trainer(
        max_steps=steps, accelerator="auto", logger=False, enable_progress_bar=False, enable_model_summary=False,
        **cc.trainer_options(),  # clusterctl: its environment, checkpoint IO and callback; devices=1, num_nodes=world
    )
    began = time.perf_counter()
    trainer.fit(Regression(step_s), data, ckpt_path=cc.resume_path())  # clusterctl: the newest committed checkpoint
    if trainer.is_global_zero:
        print(f"trained to step {trainer.global_step} in {time.perf_counter() - began:.3f} s", flush=True)


if __name__ == "__main__":
    main()
