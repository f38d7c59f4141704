"""The CLI's default AdamW learning rates per model (apps/mixprec/models.cpp, default_recipe), for the
GPU peers (torch_gpu.py, torch_max_batch.py). No torch import: torch_max_batch.py's self-test runs
without it."""

ADAMW_LR = {"mlp": 1e-3, "cnn": 2e-3, "cnn-bn": 1e-3, "gpt": 1e-3}
