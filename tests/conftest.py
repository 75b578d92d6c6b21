"""Test-wide settings."""

import torch

# Tiny models run faster on one thread than on two competing ones; results are compared within
# a test, never across thread counts.
torch.set_num_threads(1)
