"""A DataLoader whose two workers outgrow /dev/shm: run it where /dev/shm is a 1 MiB tmpfs (a mount namespace).

Two real ways a loader's shared memory runs out, each written to its own log (file descriptor 2 is pointed
at it, so the workers' own C-level lines land there too):

- ``enospc.log``: the workers return 4 MiB tensors; torch allocates each one's shared-memory file in
  /dev/shm and the allocation fails ("unable to allocate shared memory(shm) for file </torch_...>: No space
  left on device", or "unable to write to file </torch_...>" on older torch).
- ``bus.log``: the workers fill 4 MiB tensors memory-mapped from files in /dev/shm; a tmpfs page that cannot
  be had is a SIGBUS in the worker ("DataLoader worker (pid N) is killed by signal: Bus error").

One torch import; the workers are forked.  Prints the mode and the exception's class for each log.
"""

import gc
import os
import sys
import traceback

import torch
from torch.utils.data import DataLoader, Dataset

ITEM = 1 << 20  # float32 elements: 4 MiB, four times the tmpfs
# a failed loader's shutdown waits this long for each worker (5 s by default): the test need not idle
torch.utils.data._utils.MP_STATUS_CHECK_INTERVAL = 0.2


class Items(Dataset):  # type: ignore[type-arg]
    def __init__(self, mode: str) -> None:
        self.mode = mode

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.mode == "bus":
            mapped = torch.from_file(f"/dev/shm/gpuq-item-{os.getpid()}-{i}", shared=True, size=ITEM)
            return mapped.fill_(1.0)
        return torch.ones(ITEM)


def load(mode: str) -> str:
    try:
        for _batch in DataLoader(Items(mode), batch_size=2, num_workers=2):
            pass
    except Exception as exc:  # the trainer's crash, as Python prints it
        traceback.print_exc()
        return type(exc).__name__
    return "no error"


for mode in ("enospc", "bus"):
    sys.stderr.flush()
    log = os.open(f"{mode}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 2)
    os.close(log)
    outcome = load(mode)
    sys.stderr.flush()
    gc.collect()  # the failed loader's iterator, before the next loader forks its workers
    print(mode, outcome, flush=True)
