"""The pipeline's wire format: a message as UTF-8 JSON, read back field by field into the types of an allowlist.

A message is a dataclass instance of an allowed type (``ssd.pipeline.protocol.WIRE_TYPES``). Its fields hold None,
bool, int, float, str, lists, and these, tagged so that they come back as they left:

    {"tuple": [...]}                                  a tuple
    {"dict": [[key, value], ...]}                     a dict whose keys are ints or strs (JSON keys are strs only)
    {"tensor": {"dtype", "shape", "bytes"}}           a tensor: an allowed dtype, its shape, base64 of its bytes
    {"type": "Verdict", "fields": {...}}              an instance of an allowed dataclass, every init field named

Unlike pickle, reading a message runs no code the sender chose: a type name only selects from the allowlist, each
field's value must fit the field's annotation, and the dataclass is built through its own constructor (so its
__post_init__ checks run). Anything else is a WireError with a one-line reason. On the link each message is framed by
a header (record bytes, q rows, q columns) that the receiver checks before it allocates (``check_header``).
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math
import re
import types
import typing

import torch

MAX_RECORD_BYTES = 64 * 2**20  # a message's JSON; the largest real one (Start, with its profile) is a few KiB
# The q rows [n, V] float32 beside a draft: K x b rows of the vocabulary (Qwen's 152k: 0.6 GB at K x b = 1024)
MAX_Q_BYTES = 2**31
DTYPES = {str(d).removeprefix("torch."): d for d in (  # "int64": torch.int64, ...
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64)}


class WireError(ValueError):
    """A message that cannot cross: malformed, oversized, or holding what the wire does not carry."""


def check_header(n: int, rows: int, cols: int) -> None:
    """A header announces the record's bytes and the q rows' shape; refuse it before a buffer is allocated."""
    if not 0 < n <= MAX_RECORD_BYTES:
        raise WireError(f"the header announces a record of {n} bytes; the bound is 1 to {MAX_RECORD_BYTES}")
    if rows < 0 or cols < 0 or (rows == 0) != (cols == 0) or rows * cols * 4 > MAX_Q_BYTES:
        raise WireError(f"the header announces q rows of shape [{rows}, {cols}]; the bound is {MAX_Q_BYTES} bytes")


class Wire:
    """Encode and decode the messages of one allowlist of dataclasses."""

    def __init__(self, allowed: tuple[type, ...]):
        self.types = {cls.__name__: cls for cls in allowed}
        # The annotations, resolved once in each dataclass's own module (the message never names one).
        self.hints = {name: typing.get_type_hints(cls) for name, cls in self.types.items()}

    # ---- encode --------------------------------------------------------------------------------------------------

    def encode(self, message) -> bytes:
        if self.types.get(type(message).__name__) is not type(message):
            raise WireError(f"a {type(message).__name__} is not a message type of the wire")
        data = json.dumps(self._tree(message, type(message).__name__), separators=(",", ":")).encode()
        if len(data) > MAX_RECORD_BYTES:
            raise WireError(f"a {type(message).__name__} of {len(data)} bytes exceeds {MAX_RECORD_BYTES}")
        return data

    def _tree(self, value, where: str):
        """value as JSON-ready values and tags."""
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return float(value)
        if isinstance(value, list):
            return [self._tree(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return {"tuple": [self._tree(v, f"{where}[{i}]") for i, v in enumerate(value)]}
        if isinstance(value, dict):
            bad = [k for k in value if isinstance(k, bool) or not isinstance(k, (int, str))]
            if bad:
                raise WireError(f"{where}: a dict key {bad[0]!r} is neither an int nor a str")
            return {"dict": [[k, self._tree(v, f"{where}[{k!r}]")] for k, v in value.items()]}
        if isinstance(value, torch.Tensor):
            return {"tensor": _tensor_tree(value, where)}
        if self.types.get(type(value).__name__) is type(value):
            fields = {f.name: self._tree(getattr(value, f.name), f"{where}.{f.name}")
                      for f in dataclasses.fields(value) if f.init}
            return {"type": type(value).__name__, "fields": fields}
        raise WireError(f"{where}: a {type(value).__name__} cannot cross the wire")

    # ---- decode --------------------------------------------------------------------------------------------------

    def decode(self, data: bytes):
        try:
            message = self._value(_json(data), "")
        except RecursionError:  # from json, or from reading arrays nested just within json's own limit
            raise WireError("values nested too deeply") from None
        if self.types.get(type(message).__name__) is not type(message):
            raise WireError(f"the message is a {type(message).__name__}, not a record")
        return message

    def _value(self, tree, where: str):
        """The value a JSON tree stands for; where: its path in the message, for the error."""
        if tree is None or isinstance(tree, (bool, int, float, str)):
            return tree
        if isinstance(tree, list):
            return [self._value(v, f"{where}[{i}]") for i, v in enumerate(tree)]
        tag = sorted(tree)
        if tag == ["tuple"] and isinstance(tree["tuple"], list):
            return tuple(self._value(v, f"{where}[{i}]") for i, v in enumerate(tree["tuple"]))
        if tag == ["dict"] and isinstance(tree["dict"], list):
            return self._dict(tree["dict"], where)
        if tag == ["tensor"] and isinstance(tree["tensor"], dict):
            return _tensor(tree["tensor"], where)
        if tag == ["fields", "type"] and isinstance(tree["type"], str) and isinstance(tree["fields"], dict):
            return self._record(tree["type"], tree["fields"], where)
        raise WireError(f"{where or 'the message'}: an object {json.dumps(tree)[:60]} is no tagged value")

    def _dict(self, pairs: list, where: str) -> dict:
        out = {}
        for pair in pairs:
            if not (isinstance(pair, list) and len(pair) == 2 and _is_key(pair[0])) or pair[0] in out:
                raise WireError(f"{where}: a dict entry {json.dumps(pair)[:60]} is no [int or str key, value] pair "
                                "of a new key")
            out[pair[0]] = self._value(pair[1], f"{where}[{pair[0]!r}]")
        return out

    def _record(self, name: str, fields: dict, where: str):
        cls = self.types.get(name)
        if cls is None:
            raise WireError(f"unknown type {name!r}" + (f" at {where}" if where else ""))
        where = where or name
        expected = [f.name for f in dataclasses.fields(cls) if f.init]
        missing, unknown = [f for f in expected if f not in fields], [f for f in fields if f not in expected]
        if missing or unknown:
            what = "; ".join([f"missing field {f!r}" for f in missing] + [f"unknown field {f!r}" for f in unknown])
            raise WireError(f"{where}: {what}")
        values = {}
        for field in expected:
            value, hint = self._value(fields[field], f"{where}.{field}"), self.hints[name][field]
            if not _fits(value, hint):
                raise WireError(f"{where}.{field}: expected {_hint_name(hint)}, got {_shown(value)}")
            values[field] = value
        try:
            return cls(**values)
        except (ValueError, TypeError) as e:
            raise WireError(f"{where}: {name} refuses its fields ({_first_line(e)})") from None


def _json(data: bytes):
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise WireError(f"not UTF-8 JSON ({_first_line(e)})") from None


def _tensor_tree(tensor: torch.Tensor, where: str) -> dict:
    dtype = str(tensor.dtype).removeprefix("torch.")
    if dtype not in DTYPES:
        raise WireError(f"{where}: a tensor of dtype {dtype} cannot cross the wire")
    data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return {"dtype": dtype, "shape": list(tensor.shape), "bytes": base64.b64encode(data).decode("ascii")}


def _tensor(spec: dict, where: str) -> torch.Tensor:
    if sorted(spec) != ["bytes", "dtype", "shape"]:
        raise WireError(f"{where}: a tensor needs exactly dtype, shape and bytes, got {sorted(spec)}")
    dtype, shape = DTYPES.get(spec["dtype"]) if isinstance(spec["dtype"], str) else None, spec["shape"]
    if dtype is None:
        raise WireError(f"{where}: a tensor of dtype {spec['dtype']!r} is not allowed (allowed: {', '.join(DTYPES)})")
    if not (isinstance(shape, list) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)):
        raise WireError(f"{where}: a tensor's shape must be a list of sizes >= 0, got {json.dumps(shape)[:60]}")
    try:
        data = base64.b64decode(spec["bytes"], validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise WireError(f"{where}: a tensor's bytes are not base64") from None
    if len(data) != math.prod(shape) * dtype.itemsize:  # before any buffer of that shape exists
        raise WireError(f"{where}: a {dtype} tensor of shape {shape} needs {math.prod(shape) * dtype.itemsize} bytes, "
                        f"got {len(data)}")
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape) if data else torch.empty(shape, dtype=dtype)


def _is_key(key) -> bool:
    return isinstance(key, str) or (isinstance(key, int) and not isinstance(key, bool))


def _fits(value, hint) -> bool:
    """Does a decoded value fit a field's annotation? (bool is no int here, and an int is a float, as in Python's
    numeric tower.)"""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in (object, typing.Any):
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in args)
    if hint in (int, float):
        return isinstance(value, (int, float) if hint is float else int) and not isinstance(value, bool)
    if hint is type(None):
        return value is None
    if origin is None:  # bool, str, a tensor, a dataclass, or a bare list / dict / tuple
        return isinstance(value, hint)
    if not isinstance(value, origin):
        return False
    if origin is list:
        return all(_fits(v, args[0]) for v in value)
    if origin is dict:
        return all(_fits(k, args[0]) and _fits(v, args[1]) for k, v in value.items())
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return all(_fits(v, args[0]) for v in value)
    if origin is tuple:
        return len(value) == len(args) and all(map(_fits, value, args))
    raise TypeError(f"the wire cannot check a field annotated {hint}")  # a message type the kit should not have


def _hint_name(hint) -> str:
    """dict[int, ssd.core.verify.Verdict] -> dict[int, Verdict]"""
    text = hint.__name__ if typing.get_origin(hint) is None and isinstance(hint, type) else str(hint)
    return re.sub(r"[\w.]+\.(\w+)", r"\1", text)


def _shown(value) -> str:
    text = repr(value).replace("\n", " ")
    return f"{text[:60]}..." if len(text) > 60 else text


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
