"""Test-wide settings: tiny models run fastest single-threaded (no thread start-up per op)."""

import torch

torch.set_num_threads(1)
