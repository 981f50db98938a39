"""Test-wide settings: tiny models run fastest single-threaded (no thread start-up per op).

`auto` depends on the CPU (native bf16 makes the UNet compute in bf16), so the suite pins the CPU
flags it sees to a CPU without native half precision or int8: every test resolves `auto` the same
on every machine. The decision table itself is tested on synthetic capability sets
(tests/test_hardware.py). Child processes the tests start inherit the pin.
"""

import os

import torch

os.environ["MIXGRAPH_CPU_FLAGS"] = "sse4_2 avx avx2 fma"

torch.set_num_threads(1)
