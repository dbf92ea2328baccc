"""scripts/provider_live_check.py's sanitizer (the script itself rents real machines and never runs in the
suite): what it writes into tests/fixtures/providers/<provider>/live/ holds no key, address, SSH key or
account id, and keeps everything else as the provider sent it."""

from __future__ import annotations

import json

from orchestrator.ledger import HostRow
from orchestrator.views.hosts import host_flags, lease_text
from scripts.provider_live_check import REDACTED, sanitize

KEY = "vast_LIVE0KEY0abcdef0123456789"
PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB0bGl2ZWNoZWNrMDEyMzQ1Njc4OTAxMjM0NTY3ODkw gpuq-live-check"


def test_the_recording_keeps_no_secret_address_key_or_account_id() -> None:
    exchange = {
        "request": {"method": "PUT", "url": "https://console.vast.ai/api/v0/asks/123/", "query": {"owner": "me"},
                    "json": {"client_id": "me", "label": "gpuq-1a2b3c4d-abcdef", "ssh_key": PUB,
                             "env": {"NOTE": f"key {KEY}"}}},
        "response": {"status": 200, "json": {
            "instances": {"id": 4242, "actual_status": "running", "public_ipaddr": "198.51.100.7",
                          "ssh_host": "ssh4.vast.ai", "host_id": 77, "machine_id": 9001, "num_gpus": 1,
                          "status_msg": "pulled; reach me at 203.0.113.9 or 2001:db8::42, mail ops@example.com",
                          "owner": {"user_id": 31337, "email": "me@example.com", "team": "gpuq"},
                          "ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "41022"}]}}}},
    }
    clean = sanitize(exchange, (KEY,))
    text = json.dumps(clean)
    for secret in (KEY, "198.51.100.7", "203.0.113.9", "2001:db8::42", "AAAAC3NzaC1lZDI1NTE5", "ops@example.com",
                   "31337", "9001", "ssh4.vast.ai"):
        assert secret not in text, secret
    inst = clean["response"]["json"]["instances"]
    assert inst["host_id"] == inst["machine_id"] == inst["public_ipaddr"] == REDACTED
    # what the fixture is for stays as sent: ids of the instance and offer, states, ports, counts, labels
    assert (inst["id"], inst["actual_status"], inst["num_gpus"]) == (4242, "running", 1)
    assert inst["ports"]["22/tcp"][0]["HostPort"] == "41022"
    assert clean["request"]["url"].endswith("/asks/123/") and clean["request"]["json"]["label"].startswith("gpuq-")
    assert clean["request"]["json"]["ssh_key"] == "<ssh-key>"


def test_a_stopped_machine_is_said_to_bill_its_disk_where_its_provider_bills_it() -> None:
    def row(provider: str, state: str) -> HostRow:
        return HostRow(name="v1", kind="ssh", root="/r", provider=provider, lease_state=state,
                       lease_reason="Outbid", instance_id="42", created_at=0.0)

    assert "still bills its disk" in lease_text(row("vastai", "preempted"))
    assert any("still bills its disk" in text for text, _style in host_flags(row("vastai", "stopped")))
    assert "bills" not in lease_text(row("lambda", "failed")) and "bills" not in lease_text(row("vastai", "failed"))
    # an EXITED RunPod pod bills no compute but keeps (and bills) its container disk and pod volume
    assert "still bills its disk" in lease_text(row("runpod", "stopped"))
    assert any("still bills its disk" in text for text, _style in host_flags(row("runpod", "stopped")))
    assert "bills" not in lease_text(row("lambda", "stopped")) and "bills" not in lease_text(row("toy", "stopped"))


def test_spot_on_a_provider_without_spot_is_refused_before_any_call() -> None:
    from scripts.provider_live_check import main

    assert main(["runpod", "--spot"]) == 2  # no key needed: nothing is asked of RunPod
