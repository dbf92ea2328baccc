"""Loaded by every Python process of the payload resume tests (PYTHONPATH): torch.distributed's
pickle-based collectives raise, so a payload that still used one fails its run (issue 23 item 3)."""

from collections.abc import Callable
from typing import Any, NoReturn

import torch.distributed as _tdist
import torch.distributed.distributed_c10d as _c10d

OBJECT_COLLECTIVES = ("all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
                      "send_object_list", "recv_object_list")


def _refuse(name: str) -> Callable[..., NoReturn]:
    def refused(*args: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError(f"pickle-based collective torch.distributed.{name} used (unpickles what a peer sends)")
    return refused


for _name in OBJECT_COLLECTIVES:
    for _module in (_tdist, _c10d):
        if hasattr(_module, _name):
            setattr(_module, _name, _refuse(_name))
