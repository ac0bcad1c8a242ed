"""The rank side: adapters that run inside the training process (Lightning, the Hugging Face Trainer, and the loop
they share). The login side is submitit/ (the executor users call, and the job runner it submits)."""
