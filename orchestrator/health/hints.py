"""The fix for each failure class (docs/health.md, "Failure classes and retries"): what a person does
about an attempt that ended in it, as ``gpuq explain`` shows it.  ``JOB``, ``N`` and ``HOST`` stand for
the job, the attempt and its host; ``hint`` fills them in."""

from __future__ import annotations

HINTS: dict[str, str] = {
    "stopped": "a stop gpuq did not send (a preemption's grace, a container or node shutdown): retried with "
               "resume; nothing to fix unless it recurs on one host",
    "config": "a bug or a wrong setting: read the exception at the end of `gpuq logs JOB --attempt N`, fix the "
              "trainer or its config and submit again (never retried)",
    "transient": "a passing fault (exit 3, an NCCL error, a reboot): retried with resume; if it recurs on one "
                 "host, `gpuq doctor HOST`",
    "control_plane": "the artifacts failed verification (exit 82): check the host's disk and the run dir, then "
                     "`gpuq results`",
    "divergence": "the loss became non-finite: lower the learning rate, add warmup or gradient clipping, check "
                  "the data for NaNs, check AMP's loss scaling (GradScaler) or train in bf16 (never retried)",
    "gpu_oom": "CUDA out of memory: a smaller batch (with gradient accumulation), mixed precision, activation "
               "checkpointing, or a GPU with more memory",
    "disk_full": "the host's data disk is full: prune old checkpoints or results there, or a host with more "
                 "disk (`gpuq hosts show HOST` shows its free space)",
    "host_oom": "the host ran out of CPU memory: fewer DataLoader workers or a smaller prefetch, a smaller "
                "batch, memory-mapped data, or a host with more RAM; retried with resume",
    "killed": "a signal gpuq did not send ended it (kill -9, a watchdog, a scheduler): retried with resume; "
              "the host's kernel log says who, if it recurs",
    "vanished": "the process group died without an exit record (kill -9 of the wrapper, a host restart): "
                "retried with resume",
    "stalled": "nothing written for stall_after_s while the process lived: a hang (a DataLoader or collective "
               "deadlock, a dead network mount); the saved stacks show where; retried with resume",
    "shm_exhausted": "/dev/shm is too small for the DataLoader workers: run the container with --shm-size=8g "
                     "or --ipc=host, use fewer workers, or torch.multiprocessing.set_sharing_strategy"
                     "('file_system') (never retried)",
    "checkpoint_mismatch": "the checkpoint does not fit the model (missing, unexpected or resized keys): the "
                           "model or its config changed since it was saved; start fresh or load it with the "
                           "config that wrote it (never retried)",
    "deadlock_at_start": "no step was ever reached: a hang before training (a DataLoader worker deadlock, "
                         "NCCL init or a rendezvous that never formed, a lock or barrier not every rank reaches); "
                         "the saved stacks show where; try num_workers=0, NCCL_DEBUG=INFO (retried once at most)",
    "setup": "the project's setup failed on the host: read its output in `gpuq logs JOB --attempt N`, fix the "
             "setup command; the job waits for another host",
    "unknown": "no known signature: read the end of `gpuq logs JOB --attempt N`",
}


def hint(klass: str, job_id: str, attempt: int, host: str) -> str:
    """The fix for ``klass`` with the job, attempt and host filled in; "" for a class without one."""
    text = HINTS.get(klass, "")
    return text.replace("JOB", job_id).replace("--attempt N", f"--attempt {attempt}").replace("HOST", host)
