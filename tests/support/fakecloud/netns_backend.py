"""A host backend whose pods/instances are real OpenSSH hosts of a HostFarm (tests/support/testhosts/).

    farm = HostFarm(base, n=3, gpus=2).start()         # the pool: every host a machine for rent
    with NetnsBackend(farm) as backend, FakeRunPod(backend=backend) as cloud:
        ...                                            # gpuq up -> SSH -> jobs -> cloud.preempt(pod) -> resume
        backend.wait_idle()                            # background boots/kills/wipes done (raises their errors)

What the fakes' calls do to a host (docs/providers.md):

- ``provision`` of a new instance id rents the first free host of the pool: killed if up, a fresh /root
  (the farm's client key and ``authorized_keys`` only), a fresh /tmp, a NEW host key when an earlier
  instance had the host (a new rental is a new machine), a fresh kernel log, ``gpu_count`` fake GPUs
  (UUIDs seeded by the instance id), then booted.  ``provision`` of an id that has a host (resume,
  restart) boots the SAME host again if it is down: same key, same /root, fresh /tmp, ``gpu_count``
  GPUs (zero for RunPod's zero-GPU resume).  Returns ``(host address, 22)``; with ``moving_ports`` a
  resume answers on the other of the host's two sshd ports (22 and ALT_SSH_PORT), as RunPod maps a new
  public port on every start.
- ``preempt(id, grace_s)``: SIGTERM to the host's workload (every process but PID 1 and sshd), then
  SIGKILL to everything (``farm.preempt``) after ``grace_s``, or as soon as no workload is left (a
  container stops once its processes have exited).  /root is kept; /tmp is wiped on the next boot.
- ``destroy(id)``: the host is killed, its /root and /tmp wiped and it goes back to the pool at once
  (a later rental waits behind the wipe).  Idempotent.
- ``crash(id)`` (tests, and FakeVastAI's outbid pause): the host dies at once without SIGTERM, as a
  hardware fault would; it stays down until provisioned again.

The fakes call a backend under their state lock, so every call here only queues work: each host has
one worker thread that runs its operations in order (a resume waits behind the kill of the preemption
before it).  ``is_ready(id)`` is False until the host's last queued provision has booted it and sshd
answers; the fakes consult it (RunPod: ``runtime: null``; Lambda: ``booting``).  ``events`` records
every call as ``(call, instance_id, number)`` like AddressBackend; ``actions`` records what the
workers did, as ``(action, instance_id, host index, detail)``; ``errors`` what failed.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tests.support.testhosts import ALT_SSH_PORT, HostFarm, TestHost, default_gpus

Action = tuple[str, str, int, str]


class PoolExhausted(RuntimeError):
    """Every host of the farm is rented: start the farm with more hosts."""


@dataclass
class _Slot:
    """One host of the pool and its worker."""

    index: int
    devices: int  # fake GPU nodes the host has while up
    ops: queue.SimpleQueue[tuple[str, str, Callable[[], None]] | None] = field(default_factory=queue.SimpleQueue)
    thread: threading.Thread | None = None
    owner: str | None = None  # the instance id renting it
    rentals: int = 0  # instance ids it has been handed to
    gen: int = 0  # bumped by every queued operation: only the last provision may mark it ready
    ready: bool = False
    pending: int = 0  # queued operations not yet finished
    hurry: int = 0  # queued operations that cut a preemption's grace short
    port: int = 22  # the port the instance's endpoint last answered on


class NetnsBackend:
    """:class:`tests.support.fakecloud.backend.HostBackend` over a started HostFarm (see the module docstring).

    ``gpu_name``/``gpu_mem_mib``: what the hosts' nvidia-smi reports (default: the farm's).
    ``authorized_keys``: public key lines installed in every new rental's /root/.ssh/authorized_keys
    besides the farm's client key (the keys a real account would push to its pods); ``authorize_key``
    adds more later.  Close the backend before tearing the farm down (closing does not tear it down)."""

    def __init__(self, farm: HostFarm, *, gpu_name: str | None = None, gpu_mem_mib: int | None = None,
                 authorized_keys: Iterable[str] = (), moving_ports: bool = False) -> None:
        if not farm.hosts:
            raise ValueError("NetnsBackend needs a started HostFarm")
        if farm.gpus < 1:
            raise ValueError("NetnsBackend needs a farm with gpus >= 1 (its hosts have no nvidia-smi otherwise)")
        self.farm = farm
        self.moving_ports = moving_ports  # a resume answers on the other of sshd's two ports (RunPod)
        self.gpu_name = gpu_name or farm.gpu_name
        self.gpu_mem_mib = gpu_mem_mib or farm.gpu_mem_mib
        self.authorized_keys = [k.strip() for k in authorized_keys if k.strip()]
        self.events: list[tuple[str, str, float]] = []
        # called as (farm host index, instance id, fresh) once a machine is up, before the API says so:
        # a test's way to give one rental a fault of its own (its GPU state is reset on every new rental)
        self.on_up: Callable[[int, str, bool], None] | None = None
        self.actions: list[Action] = []
        self.errors: list[str] = []
        self._cond = threading.Condition()
        self._closed = False
        self._owner: dict[str, int] = {}
        self._inside: dict[str, tuple[dict[str, str], dict[str, Callable[[str], str]]]] = {}  # in_instance
        self._slots = [_Slot(index=h.index, devices=farm.gpus) for h in farm.hosts]
        for slot in self._slots:
            slot.thread = threading.Thread(target=self._work, args=(slot,), daemon=True,
                                           name=f"netns-backend-{farm.farm_id}-{slot.index}")
            slot.thread.start()

    # -- HostBackend ----------------------------------------------------------------------------------

    def provision(self, instance_id: str, gpu_count: int) -> tuple[str, int]:
        with self._cond:
            self._check_open()
            self.events.append(("provision", instance_id, float(gpu_count)))
            index = self._owner.get(instance_id)
            fresh = index is None
            if index is None:
                free = next((s for s in self._slots if s.owner is None), None)
                if free is None:
                    raise PoolExhausted(f"all {len(self._slots)} hosts of farm {self.farm.farm_id} are rented; "
                                        "start the farm with more hosts")
                free.owner = instance_id
                self._owner[instance_id] = index = free.index
            slot = self._slots[index]
            renew = fresh and slot.rentals > 0
            if fresh:
                slot.rentals += 1
            gen = self._bump(slot)
            self._queue(slot, "provision", instance_id,
                        lambda: self._do_provision(slot, gen, instance_id, gpu_count, fresh, renew))
            h = self.farm.hosts[index]
            if fresh or not self.moving_ports:
                slot.port = h.port
            else:  # RunPod maps a new public port on every start: alternate between sshd's two ports
                slot.port = ALT_SSH_PORT if slot.port == h.port else h.port
            return h.address, slot.port

    def preempt(self, instance_id: str, grace_s: float) -> None:
        with self._cond:
            self.events.append(("preempt", instance_id, float(grace_s)))
            slot = self._slot_of(instance_id)
            if slot is None or self._closed:
                return
            self._bump(slot)
            self._queue(slot, "preempt", instance_id, lambda: self._do_preempt(slot, instance_id, grace_s))

    def destroy(self, instance_id: str) -> None:
        with self._cond:
            self.events.append(("destroy", instance_id, 0.0))
            slot = self._slot_of(instance_id)
            if slot is None:
                return
            del self._owner[instance_id]
            slot.owner = None  # back to the pool now; the next rental queues behind the wipe
            self._bump(slot)
            slot.hurry += 1
            self._cond.notify_all()
            self._queue(slot, "destroy", instance_id, lambda: self._do_destroy(slot, instance_id))

    def in_instance(self, instance_id: str, env: dict[str, str], tools: dict[str, Callable[[str], str]]) -> None:
        """What the provider puts inside ``instance_id`` (fakecloud/backend.py ``give_instance``): at each boot
        its host's PID 1 gets ``env`` and its /usr/local/bin the ``tools``, rendered for the host's gateway."""
        with self._cond:
            self._inside[instance_id] = (dict(env), dict(tools))

    # -- readiness hook consulted by the fakes ----------------------------------------------------------

    def is_ready(self, instance_id: str) -> bool:
        """The instance's host has booted after its last provision and is up (sshd answered then)."""
        with self._cond:
            slot = self._slot_of(instance_id)
            if slot is None or not slot.ready:
                return False
        return self.farm.hosts[slot.index].init_alive()

    # -- tests ----------------------------------------------------------------------------------------

    def crash(self, instance_id: str) -> None:
        """The instance's host dies now (SIGKILL to everything, no SIGTERM), as on a hardware fault; it
        stays down until provisioned again.  FakeVastAI calls it for an outbid pause (no signal); the other
        fakes do not: pair it with their own controls (e.g. FakeLambda.host_failure, which leaves the
        machine's fate open)."""
        with self._cond:
            self.events.append(("crash", instance_id, 0.0))
            slot = self._slot_of(instance_id)
            if slot is None:
                return
            self._bump(slot)
            slot.hurry += 1
            self._cond.notify_all()
            self._queue(slot, "crash", instance_id, lambda: self._do_crash(slot, instance_id))

    def authorize_key(self, public_key: str) -> None:
        """Install ``public_key`` in rentals from now on (hosts already rented keep their keys)."""
        with self._cond:
            if public_key.strip() and public_key.strip() not in self.authorized_keys:
                self.authorized_keys.append(public_key.strip())

    def host_index(self, instance_id: str) -> int | None:
        with self._cond:
            return self._owner.get(instance_id)

    def host(self, instance_id: str) -> TestHost:
        """The farm host rented by ``instance_id`` (KeyError when it has none)."""
        index = self.host_index(instance_id)
        if index is None:
            raise KeyError(f"no host is rented by {instance_id}")
        return self.farm.hosts[index]

    def owner(self, index: int) -> str | None:
        """The instance id renting host ``index`` (None: in the pool)."""
        with self._cond:
            return self._slots[index].owner

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until every queued operation has finished; raise if one failed or the wait times out."""
        with self._cond:
            done = self._cond.wait_for(lambda: all(s.pending == 0 for s in self._slots), timeout)
            errors = list(self.errors)
        if errors:
            raise RuntimeError("NetnsBackend operations failed:\n" + "\n".join(errors))
        if not done:
            busy = [s.index for s in self._slots if s.pending]
            raise TimeoutError(f"NetnsBackend still busy after {timeout}s on hosts {busy}")

    def close(self, timeout: float = 30.0) -> None:
        """Cut pending graces short, skip pending boots, stop the workers.  Idempotent; the farm stays."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        for slot in self._slots:
            slot.ops.put(None)
        deadline = time.monotonic() + timeout
        for slot in self._slots:
            if slot.thread is not None:
                slot.thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> NetnsBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals (the _queue/_bump/_slot_of helpers need self._cond held) ---------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this NetnsBackend is closed")

    def _slot_of(self, instance_id: str) -> _Slot | None:
        index = self._owner.get(instance_id)
        return None if index is None else self._slots[index]

    def _bump(self, slot: _Slot) -> int:
        slot.gen += 1
        slot.ready = False
        return slot.gen

    def _queue(self, slot: _Slot, what: str, instance_id: str, op: Callable[[], None]) -> None:
        slot.pending += 1
        slot.ops.put((what, instance_id, op))

    def _act(self, action: str, instance_id: str, index: int, detail: str = "") -> None:
        with self._cond:
            self.actions.append((action, instance_id, index, detail))

    def _work(self, slot: _Slot) -> None:
        while True:
            item = slot.ops.get()
            if item is None:
                return
            what, instance_id, op = item
            try:
                op()
            except Exception as exc:
                with self._cond:
                    self.errors.append(f"{what} {instance_id} on host {slot.index}: {exc!r}")
            finally:
                with self._cond:
                    slot.pending -= 1
                    self._cond.notify_all()

    def _kill(self, slot: _Slot, instance_id: str) -> None:
        if self.farm.is_up(slot.index):
            self.farm.preempt(slot.index)
            self._act("kill", instance_id, slot.index)

    def _do_provision(self, slot: _Slot, gen: int, instance_id: str, gpu_count: int, fresh: bool,
                      renew: bool) -> None:
        farm, i = self.farm, slot.index
        if self._closed or farm.torn_down:
            return
        if fresh:
            self._kill(slot, instance_id)
            with self._cond:
                keys = list(self.authorized_keys)
            farm.wipe_root(i, keys)
            farm.wipe_tmp(i)
            self._act("wipe", instance_id, i, "new rental")
            if renew:
                self._act("new_host_key", instance_id, i, farm.renew_host_key(i))
            farm.clear_kernel_log(i)
        elif farm.is_up(i) and slot.devices != gpu_count:
            self._kill(slot, instance_id)  # a running host cannot change its GPU nodes: reboot it
        state = farm.read_gpu_state(i)
        if fresh:
            state["broken"] = False
        state["gpus"] = default_gpus(f"{farm.farm_id}/{instance_id}", gpu_count, self.gpu_name, self.gpu_mem_mib)
        farm.write_gpu_state(i, state)
        farm.set_gpu_devices(i, gpu_count)
        if not farm.is_up(i):
            slot.devices = gpu_count
            self._furnish(i, instance_id)
            farm.boot(i)  # a fresh /tmp; returns once sshd answers
            self._act("boot", instance_id, i, f"{gpu_count} GPUs")
        if self.on_up is not None:
            self.on_up(i, instance_id, fresh)
        with self._cond:
            if slot.gen == gen and slot.owner == instance_id:
                slot.ready = True

    def _furnish(self, i: int, instance_id: str) -> None:
        """The instance's own environment and CLI tools on host ``i`` before it boots (none: a bare host)."""
        with self._cond:
            env, tools = self._inside.get(instance_id, ({}, {}))
        h = self.farm.hosts[i]
        h.init_env = dict(env)
        bindir = h.root_dir / "bin"
        for name, text in tools.items():
            (bindir / f"{name}.py").write_text(text(h.gateway))
            (bindir / name).write_text(f'#!/bin/sh\nexec python3 -I -S /usr/local/bin/{name}.py "$@"\n')
            (bindir / name).chmod(0o755)

    def _do_preempt(self, slot: _Slot, instance_id: str, grace_s: float) -> None:
        farm, i = self.farm, slot.index
        if not farm.is_up(i):
            return
        sent = farm.signal_workload(i, signal.SIGTERM)
        self._act("sigterm", instance_id, i, f"{len(sent)} processes")
        self._act("grace", instance_id, i, self._grace(slot, grace_s))
        self._kill(slot, instance_id)

    def _grace(self, slot: _Slot, grace_s: float) -> str:
        """Wait out a preemption's grace: "full", "idle" (no workload left), or "cut" (destroy/crash/close)."""
        deadline = time.monotonic() + grace_s
        while True:
            with self._cond:
                if slot.hurry > 0 or self._closed:
                    return "cut"
                left = deadline - time.monotonic()
                if left <= 0:
                    return "full"
                self._cond.wait(min(left, 0.05))
            with contextlib.suppress(Exception):
                if not self.farm.workload_pids(slot.index):
                    return "idle"

    def _do_destroy(self, slot: _Slot, instance_id: str) -> None:
        try:
            self._kill(slot, instance_id)
            self.farm.wipe_root(slot.index)
            self.farm.wipe_tmp(slot.index)
            self._act("wipe", instance_id, slot.index, "destroyed")
        finally:
            with self._cond:
                slot.hurry -= 1

    def _do_crash(self, slot: _Slot, instance_id: str) -> None:
        try:
            self._kill(slot, instance_id)
        finally:
            with self._cond:
                slot.hurry -= 1
