"""The host stops its own billing when the controller is gone (issue 38 item 2, docs/cost.md).

On a leased host, every agent verb the controller calls (status, enqueue, collect, ...) touches
``controller_contact`` in the root (``touch_contact``); a host without ``lease.json`` is never written by it.
A controller that rents a host writes ``lease.json`` there (mode 0600):
``{"timeout_s": S, "notify_url": URL-or-null, "notify_format": "json"|"slack"|"discord"|"ntfy"}``; the URL
(the user's ``webhook_url``) only on a host whose provider has no in-instance stop (fleet/hostlease.py).
The serving loop asks ``decide`` at most every
``CHECK_EVERY_S`` (on its own timer, no extra thread): once the controller has been silent for
``timeout_s`` and the host has no running attempt, no claimed-unlaunched spec and nothing in its
inbox, the host ends its own billing with what its provider put inside the instance:

* RunPod: ``runpodctl pod stop $RUNPOD_POD_ID`` (the pod-scoped ``RUNPOD_API_KEY`` RunPod sets);
* vast.ai: ``vastai stop instance $CONTAINER_ID --api-key $CONTAINER_API_KEY`` (the instance key);
* otherwise (Lambda, any host without one): a POST of one JSON line to ``notify_url``.

Only ever a stop, never a terminate: the disk and its results stay, pullable later.  The host writes
``selfstop.json`` (what it does, when, why) BEFORE it acts, so the next gpuq command records the stop
even if the stop kills this process mid-call.  It acts once: a ``selfstop.json`` already there means
done.  The controller's cloud credentials never come here; only the provider's in-instance ones.

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031
from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from typing import Any, Callable, Mapping, NamedTuple

from gpuq_base.gpuq_files import atomic_write_json, read_json, utc

CONTACT_FILE = "controller_contact"  # mtime = the last gpuq command the controller ran here
LEASE_FILE = "lease.json"  # written by the controller that rented this host
SELFSTOP_FILE = "selfstop.json"  # written by the host BEFORE it stops or notifies
PREV_FILE = "selfstop.prev.json"  # the last one, once a gpuq command came after it
SELFSTOP_SCHEMA = "gpuq.selfstop/1"
CHECK_EVERY_S = 5.0
ACT_TIMEOUT_S = 60.0

WAIT = "wait"  # the lease is not up, or there is work: nothing to do
OFF = "off"  # no lease (not rented, or the user turned it off)
DONE = "done"  # already stopped or notified once
STOP = "stop"
NOTIFY = "notify"


class Verdict(NamedTuple):
    action: str
    reason: str
    mechanism: str = ""


def mechanism(env: Mapping[str, str]) -> str:
    """Which in-instance stop this host has: ``runpod``, ``vastai`` or ``""`` (none: notify only)."""
    if env.get("RUNPOD_POD_ID"):
        return "runpod"
    if env.get("CONTAINER_ID") and env.get("CONTAINER_API_KEY"):
        return "vastai"
    return ""


def decide(now: float, last_contact: float | None, timeout_s: float | None, busy: int,
           already: bool, mech: str, can_notify: bool) -> Verdict:
    """Pure: what the host does to its billing now.  ``busy`` counts running attempts, claimed
    unlaunched specs and inbox specs; ``last_contact`` is the controller's last call (or the agent's
    start, when it never called)."""
    if timeout_s is None or timeout_s <= 0:
        return Verdict(OFF, "no lease")
    if already:
        return Verdict(DONE, "already acted (selfstop.json)")
    if busy > 0:
        return Verdict(WAIT, "%d attempt(s) or spec(s) here" % busy)
    silent = now - last_contact if last_contact is not None else 0.0
    if silent < timeout_s:
        return Verdict(WAIT, "controller heard %.0fs ago (lease %.0fs)" % (silent, timeout_s))
    why = "no gpuq command for %.0fs (lease %.0fs), no work" % (silent, timeout_s)
    if mech:
        return Verdict(STOP, why, mech)
    if can_notify:
        return Verdict(NOTIFY, why + "; this provider cannot stop itself")
    return Verdict(WAIT, why + "; no in-instance stop and no notify_url: billing goes on")


def stop_argv(mech: str, env: Mapping[str, str]) -> list[str]:
    if mech == "runpod":
        return ["runpodctl", "pod", "stop", env["RUNPOD_POD_ID"]]
    return ["vastai", "stop", "instance", env["CONTAINER_ID"], "--api-key", env["CONTAINER_API_KEY"]]


def touch_contact(root: str) -> None:
    """Only on a leased host (``lease.json`` present): a host the user brought is never written by a read-only
    verb such as ``status``. Best effort: a read-only root (a probe of someone else's) must not fail the verb."""
    path = os.path.join(root, CONTACT_FILE)
    if not os.path.isfile(os.path.join(root, LEASE_FILE)):
        return
    try:
        with open(path, "a"):
            pass
        os.utime(path, None)
    except OSError:
        pass


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def write_lease(root: str, timeout_s: float) -> None:
    """The lease the controller sets (0 = off), keeping a ``notify_url`` (and its format) already there;
    unchanged: no write.  0600: the URL is the user's webhook."""
    path = os.path.join(root, LEASE_FILE)
    old = read_json(path)
    keep = old if isinstance(old, dict) else {}
    doc = {"timeout_s": max(0.0, float(timeout_s)), "notify_url": keep.get("notify_url")}
    if "notify_format" in keep:
        doc["notify_format"] = keep["notify_format"]
    if doc != old and os.path.isdir(root):
        old_mask = os.umask(0o077)
        try:
            atomic_write_json(path, doc)
        finally:
            os.umask(old_mask)
    touch_contact(root)  # the controller setting the lease is a gpuq command too (the verb's touch came first)


def notify_format(root: str) -> str:
    """The form of the notice the user's webhook reads (gpuq's ``webhook_format``): json, slack, discord, ntfy."""
    doc = read_json(os.path.join(root, LEASE_FILE))
    fmt = doc.get("notify_format") if isinstance(doc, dict) else None
    return fmt if fmt in ("json", "slack", "discord", "ntfy") else "json"


def read_lease(root: str) -> tuple[float | None, str]:
    """``(timeout_s, notify_url)`` from lease.json; ``(None, "")`` when absent or malformed."""
    doc = read_json(os.path.join(root, LEASE_FILE))
    if not isinstance(doc, dict):
        return None, ""
    t = doc.get("timeout_s")
    url = doc.get("notify_url")
    timeout_s = float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < 10 ** 7 else None
    ok_url = isinstance(url, str) and url.startswith(("http://", "https://")) and len(url) < 2048
    return timeout_s, (str(url) if ok_url else "")


def instance_env() -> dict[str, str]:
    """The agent's environment, then what the provider gave the container's PID 1: an agent started
    over ssh does not inherit RUNPOD_POD_ID / CONTAINER_API_KEY (they live in PID 1's environment)."""
    env = dict(os.environ)
    try:
        with open("/proc/1/environ", "rb") as f:
            raw = f.read(1 << 16)
    except OSError:
        return env
    for item in raw.split(b"\0"):
        key, sep, value = item.decode("utf-8", "replace").partition("=")
        if sep and key in ("RUNPOD_POD_ID", "RUNPOD_API_KEY", "CONTAINER_ID", "CONTAINER_API_KEY"):
            env.setdefault(key, value)
    return env


class SelfStop:
    """The serving loop's lease watch: ``check`` once per round, cheap between its checks."""

    def __init__(self, root: str, log: Callable[[str], None], env: Mapping[str, str] | None = None) -> None:
        self.root = root
        self.log = log
        self.env = instance_env() if env is None else dict(env)
        self.started = time.time()
        self.next_check = 0.0
        self.timeout_s: float | None = None  # the lease as last read (check), None = off
        self.can_act = False
        self.acted = os.path.exists(os.path.join(root, SELFSTOP_FILE))

    def lease_on(self) -> bool:
        """While on, the agent stays (no idle exit): it is the one that ends the billing."""
        return not self.acted and self.timeout_s is not None and self.can_act

    def check(self, busy: int) -> Verdict | None:
        mono = time.monotonic()
        if mono < self.next_check:
            return None
        self.next_check = mono + CHECK_EVERY_S
        timeout_s, url = read_lease(self.root)
        self.timeout_s = timeout_s
        self.can_act = bool(mechanism(self.env) or url)  # a host that can do nothing exits idle as before
        now = time.time()
        contact = _mtime(os.path.join(self.root, CONTACT_FILE))
        self._rearm(contact)
        last = max(contact or 0.0, self.started)  # an agent restart never counts the silence before it
        v = decide(now, last, timeout_s, busy, self.acted, mechanism(self.env), bool(url))
        if v.action in (STOP, NOTIFY):
            self.act(v, now, last, url)
        return v

    def _rearm(self, contact: float | None) -> None:
        """A gpuq command after the stop (the machine was started again): the lease holds anew; the old
        record stays as ``selfstop.prev.json``."""
        path = os.path.join(self.root, SELFSTOP_FILE)
        acted_at = _mtime(path)
        if self.acted and contact is not None and acted_at is not None and contact > acted_at:
            os.replace(path, os.path.join(self.root, PREV_FILE))
            self.acted = False

    def act(self, v: Verdict, now: float, last: float, url: str) -> None:
        argv = stop_argv(v.mechanism, self.env) if v.action == STOP else []
        doc = {"schema": SELFSTOP_SCHEMA, "action": v.action, "mechanism": v.mechanism or "notify",
               "at": utc(now), "at_epoch": now, "last_contact": utc(last), "reason": v.reason,
               "command": argv[:4]}  # never the key
        atomic_write_json(os.path.join(self.root, SELFSTOP_FILE), doc)
        self.acted = True
        self.log("SELFSTOP %s: %s" % (v.action, v.reason))
        outcome = _run(argv, dict(os.environ, **self.env)) if argv else _notify(url, doc, notify_format(self.root))
        self.log("SELFSTOP %s: %s" % (v.action, outcome))
        result = dict(doc, outcome=outcome[:500])
        atomic_write_json(os.path.join(self.root, SELFSTOP_FILE), result)


def _run(argv: list[str], env: dict[str, str]) -> str:
    """The provider's CLI with its in-instance key in the environment (runpodctl reads RUNPOD_API_KEY)."""
    try:
        p = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=ACT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as e:
        return "failed: %s" % type(e).__name__
    tail = p.stdout.decode("utf-8", "replace").strip().splitlines()[-1:] if p.stdout else []
    return "exit %d %s" % (p.returncode, tail[0][:200] if tail else "")


def notice_body(doc: Any, fmt: str) -> tuple[bytes, str]:
    """The notice in the form the user's webhook reads (orchestrator/tick/notify.py's forms): body, content type."""
    text = ("gpuq: host %s idle, no gpuq command for its lease (since %s); it cannot stop itself and is still "
            "billing: `gpuq down` or `gpuq watch` ends it" % (socket.gethostname(), doc.get("last_contact")))
    if fmt == "ntfy":
        return text.encode("utf-8"), "text/plain; charset=utf-8"
    body: dict[str, Any] = {"content": text} if fmt == "discord" else {"text": text}
    if fmt == "json":
        body["event"] = "self_stop_notice"
        body["selfstop"] = doc
    return json.dumps(body).encode("utf-8"), "application/json"


def _notify(url: str, doc: Any, fmt: str = "json") -> str:
    # here only: urllib.request (http.client, email, ssl) cost every agent call 20-100 ms of import
    import urllib.request

    body, ctype = notice_body(doc, fmt)
    req = urllib.request.Request(url, data=body, headers={"Content-Type": ctype}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=ACT_TIMEOUT_S) as r:  # noqa: S310 (the user's webhook)
            return "notified: HTTP %d" % r.status
    except (OSError, ValueError) as e:
        return "notify failed: %s" % type(e).__name__
