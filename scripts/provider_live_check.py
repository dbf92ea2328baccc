"""Rent one real machine for under two minutes and record what the provider's API said (manual; needs a
real API key and spends real money, a few cents; never part of the test suite; docs/testing.md).

    python scripts/provider_live_check.py vastai [--max-price 0.5] [--deadline-s 110] [--spot]
    python scripts/provider_live_check.py runpod [--max-price 0.5]     # RunPod's REST API v2, on demand only

It lists the provider's 1-GPU offers and rents the cheapest at or under ``--max-price`` dollars per hour
through gpuq's own adapter, prints the instance id the moment the create call answers (end it by hand in
the provider's console if this script dies), waits until the instance is ready or the hard deadline
(``--deadline-s``, at most 120 s from the create) passes, and always terminates it in a ``finally`` and
waits until the provider says it is gone.  Every HTTP exchange is written, sanitized (:func:`sanitize`:
the API key, IP addresses, SSH keys, account, user, host and machine ids and e-mail addresses replaced),
with the date, to ``tests/fixtures/providers/<provider>/live/<date>.json``: compare it with the fakes'
recordings (``<provider>/fake/``) when a provider changes its API.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
HARD_LIMIT_S = 120.0
REDACTED = "<redacted>"
_IPV4 = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.])")
_IPV6 = re.compile(r"(?<![0-9A-Fa-f:])(?=[0-9A-Fa-f:]*::|(?:[0-9A-Fa-f]{1,4}:){7})"  # compressed, or all 8 groups
                   r"(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![0-9A-Fa-f:])")
_SSH_KEY = re.compile(r"(?:ssh-(?:ed25519|rsa|dss)|ecdsa-sha2-nistp\d+|sk-ssh-ed25519@openssh\.com)\s+[A-Za-z0-9+/=]+"
                      r"(?:\s+[^\s\"']+)?")
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")
# JSON keys whose values name the account or the machines behind it
_PRIVATE_KEY = re.compile(r"(?i)^(?:.*_)?(?:account|user|owner|team|org|organization|client|host|machine|"
                          r"customer|payment|billing)(?:_?ids?)?$|^(?i:e-?mail|username|ip|ipaddr|public_ipaddr|"
                          r"private_ip|local_ipaddrs|ssh_host|hostname|jupyter_token|api_key|token)$")
_PRIVATE_HEADERS = ("authorization", "cookie", "set-cookie", "x-api-key")


def sanitize(value: Any, secrets_: tuple[str, ...] = ()) -> Any:
    """``value`` (JSON-like) with every secret in ``secrets_``, IP address, SSH key and e-mail address in
    its text replaced, and the values of account-, user-, host- and machine-naming keys redacted."""
    if isinstance(value, dict):
        return {k: (REDACTED if isinstance(k, str) and _PRIVATE_KEY.match(k) and v not in (None, "", [], {})
                    else sanitize(v, secrets_)) for k, v in value.items()}
    if isinstance(value, list):
        return [sanitize(v, secrets_) for v in value]
    if isinstance(value, str):
        text = value
        for secret in secrets_:
            if secret:
                text = text.replace(secret, REDACTED)
        text = _SSH_KEY.sub("<ssh-key>", text)
        text = _EMAIL.sub("<email>", text)
        text = _IPV4.sub("<ip>", text)
        return _IPV6.sub("<ip>", text)
    return value


class Recording(httpx.BaseTransport):
    """Passes requests on and keeps each exchange (headers that carry credentials left out)."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.exchanges: list[dict[str, Any]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        started = time.time()
        response = self.inner.handle_request(request)
        response.read()
        self.exchanges.append({"at": round(started, 3), "request": _message(request.method, str(request.url),
                                                                            request.headers, request.content),
                               "response": {"status": response.status_code, **_body(response.content),
                                            "headers": _headers(response.headers)}})
        return response


def _headers(headers: httpx.Headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _PRIVATE_HEADERS}


def _body(content: bytes) -> dict[str, Any]:
    if not content:
        return {}
    try:
        return {"json": json.loads(content)}
    except ValueError:
        return {"text": content.decode("utf-8", "replace")[:4000]}


def _message(method: str, url: str, headers: httpx.Headers, content: bytes) -> dict[str, Any]:
    parsed = httpx.URL(url)
    query = {k: v for k, v in parsed.params.items() if k.lower() not in ("api_key", "key", "token")}
    return {"method": method, "url": str(parsed.copy_with(query=None)), "query": query, **_body(content),
            "headers": _headers(headers)}


class Deadline(Exception):
    """The hard deadline passed: the finally block terminates the machine."""


def _alarm(_signum: int, _frame: FrameType | None) -> None:
    raise Deadline("the hard deadline passed")


def _ephemeral_key(folder: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuq-live-check", "-f",
                    str(folder / "id")], check=True)
    return (folder / "id.pub").read_text(encoding="utf-8").strip()


def main(argv: list[str] | None = None) -> int:
    from orchestrator.providers import registry
    from orchestrator.providers.models import OfferQuery

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("provider", choices=registry.names())
    parser.add_argument("--max-price", type=Decimal, default=Decimal("0.5"), help="USD per hour (default 0.5)")
    parser.add_argument("--deadline-s", type=float, default=110.0, help="at most 120: from the create to terminate")
    parser.add_argument("--spot", action="store_true", help="rent interruptible (vast.ai; RunPod has none)")
    args = parser.parse_args(argv)
    if args.spot and not registry.entry(args.provider).capabilities().spot:
        print(f"{args.provider} rents no spot machines (RunPod's API v2 has none): drop --spot, or check vastai",
              file=sys.stderr)
        return 2
    deadline_s = min(max(args.deadline_s, 10.0), HARD_LIMIT_S)
    recording = Recording()
    cls = registry.entry(args.provider).adapter_class()
    prov = cls.from_env(os.environ, transport=recording)
    key = prov.http.key.reveal()  # only to scrub it from the recording
    # the query admits only offers priced at or under the cap (spot: by their minimum bid)
    query = OfferQuery(gpu_count=1, spot=args.spot, max_price_per_hour=args.max_price)
    offers = sorted((o for o in prov.list_offers(query) if o.available),
                    key=lambda o: (o.spot_price_per_hour if args.spot else o.price_per_hour) or Decimal(0))
    if not offers:
        print(f"no {args.provider} offer at or under ${args.max_price}/h; nothing rented", file=sys.stderr)
        _write(args.provider, recording, key)
        return 1
    offer = offers[0]
    print(f"renting {offer.provider} {offer.gpu_type!r} ({offer.display_name}) for at most {deadline_s:.0f} s",
          flush=True)
    return _rent_once(args, prov, offer, deadline_s, recording, key)


def _rent_once(args: argparse.Namespace, prov: Any, offer: Any, deadline_s: float, recording: Recording,
               key: str) -> int:
    """Rent ``offer`` under an alarm of ``deadline_s``, wait until it is ready, end it whatever happened,
    and write the recording: 0 ready, 1 not ready, 2 a machine that may still bill."""
    from orchestrator.providers.models import ProvisionRequest, instance_name

    made: list[str] = []
    outcome = 1
    with tempfile.TemporaryDirectory() as folder:
        request = ProvisionRequest(name=instance_name(secrets.token_hex(4), secrets.token_hex(3)),
                                   gpu_type=offer.gpu_type, spot=args.spot, ssh_public_key=_ephemeral_key(Path(folder)))

        def created(name: str, instance_id: str) -> None:
            made.append(instance_id)
            print(f"INSTANCE {instance_id} ({name}): if this script dies, terminate it in the {args.provider} "
                  "console", flush=True)
            signal.setitimer(signal.ITIMER_REAL, deadline_s)

        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, deadline_s + 60.0)  # the create call itself is bounded too
        started = time.monotonic()
        try:
            prov.provision(request, on_created=created)
            ready = prov.wait_ready(made[0], timeout_s=deadline_s) if made else None
            if ready is not None:
                print(f"ready after {time.monotonic() - started:.0f} s", flush=True)
                outcome = 0
        except (Deadline, Exception) as exc:
            print(f"not ready: {type(exc).__name__}: {sanitize(str(exc), (key,))}", file=sys.stderr, flush=True)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if not _terminate_all(prov, made):
                outcome = 2
            _write(args.provider, recording, key)
            prov.close()
    return outcome


def _terminate_all(prov: Any, made: list[str]) -> bool:
    """Terminate every instance made and wait until it is gone; False when one may still bill."""
    ended = True
    for instance_id in made:
        try:
            prov.terminate(instance_id)
            prov.wait_gone(instance_id, timeout_s=120.0)
            print(f"INSTANCE {instance_id} terminated and gone", flush=True)
        except Exception as exc:  # say it loudly: it may still bill
            ended = False
            print(f"INSTANCE {instance_id} may still bill: terminate failed ({exc}); end it in the console",
                  file=sys.stderr, flush=True)
    return ended


def _write(provider: str, recording: Recording, key: str) -> Path:
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    out = ROOT / "tests" / "fixtures" / "providers" / provider / "live" / f"{today}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"provider": provider, "recorded": today, "source": "scripts/provider_live_check.py",
           "exchanges": sanitize(recording.exchanges, (key,))}
    out.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {out.relative_to(ROOT)} ({len(recording.exchanges)} exchanges, sanitized)")
    return out


if __name__ == "__main__":
    sys.exit(main())
