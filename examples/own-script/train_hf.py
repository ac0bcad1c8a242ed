"""A Hugging Face Trainer script under clusterctl: one callback, and the Trainer does the rest.

The callback reports every optimizer step with the loss the Trainer logs,
commits the Trainer's checkpoints where `clusterctl checkpoints` lists them,
resumes from the newest one after a restart, and on a pre-timeout stop
saves and exits 85 so that the run continues in a new job. A tiny GPT-2
built from a config, on random tokens: nothing is downloaded.

    STEPS=200        how many optimizer steps
    STEP_S=0         extra time each step takes, in seconds
"""

import os
import time

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, default_data_collator

from clusterctl.integrations.hf import ClusterctlCallback  # clusterctl


class RandomTokens(Dataset):
    def __init__(self, count: int, length: int, vocab: int) -> None:
        self.tokens = torch.randint(0, vocab, (count, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def main() -> None:
    steps, gpu = int(os.environ.get("STEPS", "200")), torch.cuda.is_available()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0))
    args = TrainingArguments(
        output_dir="hf-output", max_steps=steps, per_device_train_batch_size=8, learning_rate=1e-3,
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
        use_cpu=not gpu, ddp_backend=None if gpu else "gloo", ddp_find_unused_parameters=False,
    )
    cc = ClusterctlCallback()  # clusterctl: checkpoint dir, interval and keep from the job spec
    step_s = float(os.environ.get("STEP_S", "0"))

    def collate(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        time.sleep(step_s)  # stands in for a real model's compute
        return default_data_collator(samples)

    trainer = Trainer(model=model, args=cc.training_args(args), train_dataset=RandomTokens(4096, 32, 64),
                      data_collator=collate, callbacks=[cc])  # clusterctl: the accumulation at an elastic width
    began = time.perf_counter()
    trainer.train(resume_from_checkpoint=cc.resume_from())  # clusterctl: the newest committed checkpoint
    if trainer.is_world_process_zero():
        print(f"trained to step {trainer.state.global_step} in {time.perf_counter() - began:.3f} s", flush=True)


if __name__ == "__main__":
    main()
