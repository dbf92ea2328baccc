"""Is the bundle already on a host the one gpuq built?  Checked before it is reused (docs/security.md).

A bundle on a host is ``bundles/<sha>/``; its ``MANIFEST.json`` lists every file's path, size and
sha256.  A bundle whose manifest merely exists is not trusted: a job (its setup hook, a root trainer
on a host without mount namespaces, a non-root job of the agent's own user) could have rewritten
another project's code, and the next job of that project would run it.  Before reuse, ``VERIFY`` runs
on the host with the host's Python in isolated mode (``-I``), sent by the controller, never taken from
the bundle it checks:

* the manifest's sha256 must be the one in the controller's own tarball (``manifest_digest``);
* the files under ``bundles/<sha>/`` must be exactly the manifest's (no link, no extra file),
  each of its size and sha256, plus the agent's bytecode that the unpack compiled with the host's
  Python (``__pycache__/<module>.<tag>.pyc`` beside a listed module of ``payload/agent/`` or of one of
  its packages, for this interpreter's tag only): each is admitted only when its code object equals a
  fresh compile of its verified source, so a planted or rewritten ``.pyc`` is tampering like any other file;
* cheaply: a pass writes ``bundles/.<sha>.verified`` with every file's (size, mtime, ctime, inode);
  the next check rehashes only when one of those changed (ctime cannot be set back by a user);
* a failed check moves the directory aside to ``bundles/.<sha>.tampered.<time>`` (quarantined, never
  deleted) so that the launcher pushes the bundle again.
"""

from __future__ import annotations

import hashlib
import tarfile
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core import protocol
from orchestrator.core.errors import BundleError
from orchestrator.hosts.base import Host

PRESENT, ABSENT, TAMPERED = 0, 10, 11
VERIFY_TIMEOUT_S = 300.0

# stdlib only, Python >= 3.8 (the host's interpreter); argv: root, sha, the manifest's sha256
VERIFY = r"""
import hashlib, importlib.util, json, marshal, os, sys, time
root, sha, want = sys.argv[1], sys.argv[2], sys.argv[3]
bundles = os.path.join(root, "bundles")
d = os.path.join(bundles, sha)
marker = os.path.join(bundles, "." + sha + ".verified")
if not os.path.isdir(d) or os.path.islink(d):
    sys.exit(10)
def digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
def stats():
    out = {}
    for top, dirs, files in os.walk(d):
        for name in dirs + files:
            path = os.path.join(top, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, d)
            if os.path.islink(path) or (name in files and not os.path.isfile(path)):
                out[rel] = None
            elif name in files:
                out[rel] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    return out
def bad(why):
    aside = os.path.join(bundles, ".%s.tampered.%d" % (sha, int(time.time())))
    try:
        os.unlink(marker)
    except OSError:
        pass
    os.rename(d, aside)
    print("bundle %s does not match its manifest (%s); moved aside to %s" % (sha[:12], why, aside))
    sys.exit(11)
manifest = os.path.join(d, "MANIFEST.json")
if not os.path.isfile(manifest) or os.path.islink(manifest):
    bad("no MANIFEST.json")
if digest(manifest) != want:
    bad("MANIFEST.json changed")
with open(manifest, "rb") as fh:
    listed = {f["path"]: f for f in json.load(fh)["files"]}
now = stats()
TAG = getattr(sys.implementation, "cache_tag", None) or ""
AGENT = "payload/agent/"
def source_of(rel):
    head, _, name = rel.rpartition("/")
    return head[:-len("__pycache__")] + name[:-len("." + TAG + ".pyc")] + ".py"
def compiled(rel):
    # the unpack compiled the agent with this interpreter: <dir>/__pycache__/<m>.<tag>.pyc of a listed <dir>/<m>.py,
    # <dir> payload/agent/ or one of its packages; the full pass below admits it only when its code is that source's
    head, _, name = rel.rpartition("/")
    return bool(TAG) and head.startswith(AGENT) and head.endswith("/__pycache__") and \
        name.endswith("." + TAG + ".pyc") and source_of(rel) in listed
def compiled_problem(rel):
    src = source_of(rel)
    with open(os.path.join(d, rel), "rb") as fh:
        data = fh.read()
    with open(os.path.join(d, src), "rb") as fh:
        source = fh.read()
    try:
        same = data[:4] == importlib.util.MAGIC_NUMBER and \
            marshal.loads(data[16:]) == compile(source, os.path.join(d, src), "exec", dont_inherit=True)
    except Exception:
        same = False
    return not same
pycs = sorted(rel for rel in set(now) - set(listed) if now[rel] is not None and compiled(rel))
extra = sorted(set(now) - set(listed) - {"MANIFEST.json"} - set(pycs))
missing = sorted(set(listed) - set(now))
if extra or missing:
    bad("extra: %s; missing: %s" % (", ".join(extra[:5]) or "none", ", ".join(missing[:5]) or "none"))
try:
    with open(marker) as fh:
        seen = json.load(fh)
except (OSError, ValueError):
    seen = {}
if not (isinstance(seen, dict) and seen.get("manifest") == want and seen.get("files") == now):
    for rel, f in sorted(listed.items()):
        if now[rel] is None or now[rel][0] != f["bytes"] or digest(os.path.join(d, rel)) != f["sha256"]:
            bad("%s changed" % rel)
    for rel in pycs:
        if compiled_problem(rel):
            bad("%s is not the bytecode of its source" % rel)
    tmp = "%s.%d.tmp" % (marker, os.getpid())
    with open(tmp, "w") as fh:
        json.dump({"manifest": want, "files": now}, fh)
    os.replace(tmp, marker)
"""


@dataclass(frozen=True)
class Verdict:
    """``code``: PRESENT (verified, reuse it), ABSENT (push it) or TAMPERED (moved aside: push it)."""

    code: int
    detail: str = ""


def manifest_digest(tar_path: Path) -> str:
    """sha256 of the MANIFEST.json member of the controller's own bundle tarball.

    Raises BundleError when the tarball cannot be read or holds no manifest."""
    try:
        with tarfile.open(tar_path, "r:") as tar:
            for member in tar:
                if member.name == protocol.BUNDLE_MANIFEST and member.isfile():
                    handle = tar.extractfile(member)
                    if handle is not None:
                        return hashlib.sha256(handle.read()).hexdigest()
    except (OSError, tarfile.TarError) as exc:
        raise BundleError(f"cannot read the bundle {tar_path}: {exc}") from exc
    raise BundleError(f"the bundle {tar_path} holds no {protocol.BUNDLE_MANIFEST}")


def verify_on_host(host: Host, sha: str, manifest_sha: str) -> Verdict:
    """Check ``bundles/<sha>`` on ``host`` against the manifest whose sha256 is ``manifest_sha``.

    A failed check has moved the directory aside on the host (never deleted).  Raises BundleError
    when the check itself failed; HostError when the host cannot be reached."""
    result = host.run([host.python, "-I", "-c", VERIFY, host.root, sha, manifest_sha], timeout=VERIFY_TIMEOUT_S)
    if result.exit_code in (PRESENT, ABSENT, TAMPERED):
        return Verdict(result.exit_code, result.stdout.strip()[-500:])
    raise BundleError(f"host {host.name}: checking bundle {sha[:12]} against its manifest failed "
                      f"(exit {result.exit_code}): {result.stderr.strip()[-300:]}")
