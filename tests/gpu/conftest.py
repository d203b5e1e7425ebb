"""The GPU tier: CUDA tensors through the real CUDA runtime and NCCL. It runs only where torch
sees a CUDA device; elsewhere it is not collected, and tests/conftest.py prints one header line
saying it did not run (that is not a failure: CI has no GPU)."""
import torch

if not torch.cuda.is_available():
    collect_ignore_glob = ["test_*.py"]
