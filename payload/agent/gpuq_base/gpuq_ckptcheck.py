"""Is a file a sound torch checkpoint (a zip archive of a state dict)?  One implementation for both
sides: the wrapper's ``best_ckpt`` finalize check (gpuq_checks) runs it on the host, and the
controller loads this file by path (orchestrator/transfer/verify.py) to check a pulled or shipped copy.

Nothing is unpickled and torch is never imported: the archive opens, every member passes its CRC,
it holds exactly one ``<name>/data.pkl``, that pickle is complete, is a dict, names only the globals
``torch.load(weights_only=True)`` accepts for a state dict (tensor rebuild, storage types, ordered
dicts), and every storage it references is a member of the archive (``<name>/data/<key>``).
``tests/unit/test_ckptcheck.py`` holds the verdicts to ``torch.load(weights_only=True)`` on real
checkpoints and damaged ones.

stdlib only, Python >= 3.8, no sibling imports.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import pickletools
import zipfile

STRING_OPS = frozenset({"BINUNICODE", "SHORT_BINSTRING"})  # the string opcodes torch reads
# opcodes that precede the outermost object's own opcode (the protocol, memo, strings)
PRELUDE_OPS = STRING_OPS | {"PROTO", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET"}
# the pickle globals a state dict of tensors needs, and nothing else: what torch.load(weights_only=True)
# accepts for tensors, storages and ordered dicts (an arbitrary torch.* name could be a callable such as
# torch.load or torch.hub.load: never accepted)
STORAGE_KINDS = ("Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool",
                 "ComplexFloat", "ComplexDouble", "Untyped")
SAFE_GLOBALS = frozenset({
    "collections.OrderedDict", "_codecs.encode", "builtins.set", "builtins.frozenset",
    "builtins.bytearray", "builtins.slice", "builtins.complex",
    "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor_v3", "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_parameter_with_state", "torch.Size",
}) | frozenset("torch.%sStorage" % kind for kind in STORAGE_KINDS)
# the opcodes torch's weights-only unpickler reads (torch/_weights_only_unpickler.py): protocol 2, as
# torch.save writes by default; anything else (FRAME and STACK_GLOBAL of protocol 4, INST of protocol 0)
# it refuses, so the check refuses it too
TORCH_OPS = frozenset({
    "PROTO", "STOP", "GLOBAL", "NEWOBJ", "REDUCE", "BUILD", "APPEND", "APPENDS", "SETITEM", "SETITEMS", "MARK",
    "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE", "NEWFALSE", "NEWTRUE", "EMPTY_TUPLE", "EMPTY_LIST",
    "EMPTY_DICT", "EMPTY_SET", "BININT", "BININT1", "BININT2", "BINFLOAT", "BINUNICODE", "SHORT_BINSTRING",
    "BINPERSID", "BINGET", "LONG_BINGET", "BINPUT", "LONG_BINPUT", "LONG1",
})
NOT_AN_ARCHIVE = "it is not a torch checkpoint archive (no single <name>/data.pkl)"


class _Scan:
    """What the opcodes of a data.pkl say, read without unpickling."""

    def __init__(self) -> None:
        self.top: str | None = None  # the string on top of the stack, if any (what a BINPUT memoizes)
        self.memo: dict[int, str | None] = {}
        self.first: str | None = None  # what the outermost object is built from
        self.since_mark: list[str | None] = []  # values pushed since the last MARK (a persistent id's tuple)
        self.storages: set[str] = set()  # the storage keys the persistent ids name

    def push(self, value: str | None) -> None:
        self.top = value
        self.since_mark.append(value)

    def op(self, name: str, arg: object) -> str | None:
        """Take one opcode; why the pickle is refused, or None."""
        if name not in TORCH_OPS:
            return "it uses the pickle opcode %s, which torch.load(weights_only=True) refuses" % name
        ref = str(arg).replace(" ", ".", 1) if name == "GLOBAL" else None
        if ref is not None and ref not in SAFE_GLOBALS:
            return "it references %s, which torch.load(weights_only=True) refuses" % ref
        if self.first is None and name not in PRELUDE_OPS:
            self.first = "dict" if name == "EMPTY_DICT" or ref == "collections.OrderedDict" else (ref or name)
        if name in ("BINPUT", "LONG_BINPUT"):
            self.memo[int(str(arg))] = self.top
        elif name in ("BINGET", "LONG_BINGET"):
            self.push(self.memo.get(int(str(arg))))
        elif name in STRING_OPS:
            self.push(str(arg))
        elif name == "MARK":
            self.since_mark = []
        elif name == "BINPERSID":
            # torch's persistent id: ('storage', <storage type>, key, location, numel)
            found = self.since_mark
            if len(found) < 3 or found[0] != "storage" or found[2] is None:
                return "it holds a persistent id that is not a torch storage record"
            self.storages.add(found[2])
            self.top = None
        elif name != "PROTO":
            self.push(None)
        return None


def pickle_problem(data: bytes, members: frozenset[str] | None = None) -> str | None:
    """Why a torch ``data.pkl`` would not load with weights_only=True as a dict; None when it would.

    ``members``: the names under the archive's ``data/`` directory; every storage the pickle names
    must be one of them (None: not checked, a bare pickle).  Reads opcodes only (pickletools)."""
    scan = _Scan()
    try:
        for op, arg, _pos in pickletools.genops(data):
            why = scan.op(op.name, arg)
            if why is not None:
                return why
    except ValueError as exc:
        return "its pickle is damaged: %s" % exc
    if scan.first != "dict":
        return "it does not hold a dict (a state dict) but %s" % (scan.first or "nothing")
    if members is not None:
        absent = sorted(scan.storages - members)
        if absent:
            return "its pickle names storage %s, which the archive does not hold" % absent[0]
    return None


def checkpoint_problem(path: str) -> str | None:
    """Why ``path`` is not a sound torch checkpoint (zip archive of a state dict); None when it is."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            pickles = [n for n in names if n.count("/") == 1 and n.endswith("/data.pkl")]
            if len(pickles) != 1:
                return NOT_AN_ARCHIVE
            damaged = archive.testzip()
            if damaged is not None:
                return "archive member %s fails its CRC check" % damaged
            data = archive.read(pickles[0])
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, RuntimeError, ValueError) as exc:
        return "it is not a readable zip archive: %s" % exc
    top = pickles[0].split("/", 1)[0] + "/data/"
    return pickle_problem(data, frozenset(n[len(top):] for n in names if n.startswith(top)))
