"""Loaded by every Python process of the payload resume tests (PYTHONPATH): torch.distributed's
pickle-based collectives raise, so a payload that still used one fails its run (issue 23 item 3)."""

import torch.distributed as _tdist
import torch.distributed.distributed_c10d as _c10d

OBJECT_COLLECTIVES = ("all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
                      "send_object_list", "recv_object_list")


def _refuse(name):
    def refused(*args, **kwargs):
        raise RuntimeError("pickle-based collective torch.distributed.%s used (unpickles what a peer sends)" % name)
    return refused


for _name in OBJECT_COLLECTIVES:
    for _module in (_tdist, _c10d):
        if hasattr(_module, _name):
            setattr(_module, _name, _refuse(_name))
