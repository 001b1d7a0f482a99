"""The .pyi stub and the native module tiertp._scheduler must agree: same
public names, same members per class, same parameter names."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from tiertp import _scheduler

STUB = Path(_scheduler.__file__).with_name("_scheduler.pyi")


def _params(node: ast.FunctionDef) -> list[str]:
    args = node.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    return [n for n in names if n not in ("self", "cls")]


def _stub():
    tree = ast.parse(STUB.read_text())
    top, classes = {}, {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            members = {}
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    members[item.name] = _params(item)
            classes[node.name] = members
        elif isinstance(node, ast.FunctionDef):
            top[node.name] = _params(node)
        elif isinstance(node, ast.AnnAssign):
            top[node.target.id] = None
    return top, classes


def _runtime_params(obj) -> list[str] | None:
    sig = getattr(obj, "__text_signature__", None)
    if sig is None:
        return None
    params = inspect.signature(obj).parameters if not isinstance(obj, type) else {}
    return [p for p in params if p not in ("self", "cls", "$self", "$cls")]


def _public(obj) -> set[str]:
    return {n for n in vars(obj) if not n.startswith("_")}


STUB_TOP, STUB_CLASSES = _stub()


def test_same_public_names():
    runtime = {n for n in dir(_scheduler) if not n.startswith("_")}
    assert runtime == set(STUB_TOP) | set(STUB_CLASSES)


@pytest.mark.parametrize("name", sorted(STUB_CLASSES))
def test_class_members_agree(name):
    cls = getattr(_scheduler, name)
    stub_members = STUB_CLASSES[name]
    if issubclass(cls, Exception):
        assert stub_members == {}
        return
    runtime = _public(cls)
    if "__len__" in stub_members:
        assert hasattr(cls, "__len__")
    assert runtime == {m for m in stub_members if not m.startswith("_")}
    for member, stub_params in stub_members.items():
        if member == "__init__":
            obj = cls
            sig = getattr(cls, "__text_signature__", None)
            assert sig is not None, f"{name} has no constructor signature"
            params = [p for p in inspect.signature(cls).parameters]
        elif member.startswith("__"):
            continue
        else:
            obj = inspect.getattr_static(cls, member)
            if isinstance(obj, (staticmethod, classmethod)):
                obj = obj.__func__
            if inspect.isdatadescriptor(obj):
                continue  # a property: no parameters to compare
            params = _runtime_params(obj)
            assert params is not None, f"{name}.{member} has no text signature"
        assert params == stub_params, f"{name}.{member}: module {params} vs stub {stub_params}"


def test_function_signatures_agree():
    for name, stub_params in STUB_TOP.items():
        obj = getattr(_scheduler, name)
        if stub_params is None:
            continue
        assert _runtime_params(obj) == stub_params, name
