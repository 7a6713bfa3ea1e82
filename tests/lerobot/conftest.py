"""tests/lerobot/ runs in LeRobot's environment (scripts/install_lerobot_env.sh; .ci/run
runs it and fails if it cannot): omni's own suite, without LeRobot, collects nothing here.

There, torchvision 0.28.0 (the release paired with the CPU torch 2.13.0) comes from PyPI
built against CUDA torch: its compiled ops need libtorch_cuda.so and do not load, and
``import torchvision`` then stops at its unguarded ``register_fake("torchvision::nms")``
(and ``qnms``). LeRobot imports torchvision at module level (lerobot.datasets.utils, for
dataset transforms) but none of the processor or π0 code these tests run calls a
torchvision op, so the two operators' schemas are declared before anything imports it:
the import completes, and calling either op would still fail loudly (no kernel).
"""

from __future__ import annotations

from importlib import metadata

collect_ignore_glob: list[str] = []


def declare_torchvision_ops() -> None:
    import torch

    library = torch.library.Library("torchvision", "FRAGMENT")
    for op in ("nms", "qnms"):
        try:
            library.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        except RuntimeError:
            pass  # declared already: a torchvision whose own ops load
    # the library object must outlive this call, or torch drops the declarations
    declare_torchvision_ops.library = library  # type: ignore[attr-defined]


def lerobot_installed() -> bool:
    # the distribution, not find_spec("lerobot"): with tests/ on sys.path (pytest's
    # rootdir conftest), this very folder is a namespace package named lerobot
    try:
        metadata.version("lerobot")
    except metadata.PackageNotFoundError:
        return False
    return True


if lerobot_installed():
    declare_torchvision_ops()
else:
    collect_ignore_glob.append("test_*.py")
