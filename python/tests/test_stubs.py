"""The type stubs match the compiled module: same names, same parameters."""

import ast
import inspect
from pathlib import Path

import boltccl
from boltccl import _native

STUB = Path(boltccl.__file__).with_name("_native.pyi")


def stub_items():
    tree = ast.parse(STUB.read_text())
    funcs, classes, names = {}, {}, set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            funcs[node.name] = node
        elif isinstance(node, ast.ClassDef):
            classes[node.name] = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return funcs, classes, names


def params(node):
    a = node.args
    pos = [x.arg for x in a.args]
    return pos, [x.arg for x in a.kwonlyargs]


def runtime_params(obj):
    sig = inspect.signature(obj)
    pos = [p.name for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    kw = [p.name for p in sig.parameters.values() if p.kind == p.KEYWORD_ONLY]
    return pos, kw


def test_module_names_match():
    funcs, classes, names = stub_items()
    public = {n for n in dir(_native) if not n.startswith("_")} | {"__version__"}
    stubbed = set(funcs) | set(classes) | names
    assert public == stubbed, f"only in module: {public - stubbed}; only in stub: {stubbed - public}"


def test_signatures_match():
    funcs, classes, _ = stub_items()
    for name, node in funcs.items():
        assert runtime_params(getattr(_native, name)) == params(node), name
    for cname, methods in classes.items():
        cls = getattr(_native, cname)
        runtime = {n for n in dir(cls) if not n.startswith("_")}
        assert runtime == set(methods), f"{cname}: module {sorted(runtime)} vs stub {sorted(methods)}"
        for mname, node in methods.items():
            attr = inspect.getattr_static(cls, mname)
            is_prop = any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list)
            if is_prop:
                assert not callable(attr) or type(attr).__name__ == "getset_descriptor", f"{cname}.{mname}"
                continue
            pos, kw = runtime_params(getattr(cls, mname))
            spos, skw = params(node)
            # inspect drops `self` for methods of a class accessed unbound? keep it explicit.
            assert ["self"] + [p for p in pos if p != "self"] == spos and kw == skw, (
                f"{cname}.{mname}: runtime {pos} {kw} vs stub {spos} {skw}"
            )


def test_package_ships_py_typed_and_stubs():
    assert STUB.exists()
    assert Path(boltccl.__file__).with_name("py.typed").exists()
