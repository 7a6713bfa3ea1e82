"""Suite-wide settings: one intra-op thread (two cores make default threading noisy)."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
