"""Suite-wide settings: one intra-op thread (two cores make default threading noisy)."""

import importlib.util
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# tests/openpi/ runs the unmodified openpi-client, which pins numpy<2: it runs in its own
# environment (scripts/install_openpi_env.sh; .ci/run runs it and fails if it cannot)
collect_ignore = []
if importlib.util.find_spec("openpi_client") is None:
    collect_ignore.append("openpi")
