r"""How one ``xp`` source (:mod:`.lookup`, the parts of :mod:`.solvers`) becomes a NumPy/torch instance or Numba code.

* :func:`instance`: a fresh copy of the module under a name of its own (torch.compile looks globals up by module
  name), registered in ``sys.modules``, with ``xp`` bound to :data:`.ops.numpy_ops` or :func:`.ops.torch_ops`.
  A package with ``PARTS`` (:mod:`.solvers`) becomes one module: its parts' sources concatenated, their
  imports of each other dropped, as in the generated Numba code.
* :func:`generated_source` / :func:`load_generated`: the sources of several such modules concatenated, with
  ``xp`` bound to :mod:`.numba_ops` (or :mod:`.numba_fast_ops`), every ``xp.where(c, a, b)`` turned into
  ``a if c else b`` (a scalar evaluates only the branch it takes; vectorised backends must compute both), every
  function wrapped in ``njit(cache=True)``, plus a parallel driver.  The file is written once to the cache
  directory (``$BANDCORE_CACHE`` or ``~/.cache/bandcore``, named by a hash of its code), so Numba caches the
  machine code on disk.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import linecache
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

from . import slots
from .ops import numpy_ops, torch_ops

__all__ = ["FASTMATH", "cache_dir", "generated_source", "instance", "load_generated", "parts"]

#: LLVM fast-math flags that keep NaN/inf semantics (full fastmath breaks isnan and inf comparisons).
FASTMATH = ("arcp", "contract", "nsz")
_LOCK = threading.Lock()


def parts(module: ModuleType) -> tuple[ModuleType, ...]:
    """The source modules of ``module``: its ``PARTS`` (a package such as :mod:`.solvers`), else itself."""
    return tuple(getattr(module, "PARTS", (module,)))


def instance(module: ModuleType, backend: str, tag: str = "") -> ModuleType:
    """A fresh copy of ``module`` (of its :func:`parts`, concatenated) with ``xp`` bound to ``backend`` ("numpy" or
    "torch")."""
    name = f"{module.__name__}_{backend}{'_' + tag if tag else ''}"
    if name in sys.modules:
        return sys.modules[name]
    if hasattr(module, "PARTS"):
        source = "".join(_body(part, False)[0] for part in (slots, *parts(module)))
        filename = f"<{name}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
        copy = ModuleType(name, module.__doc__)
        exec(compile(source, filename, "exec"), copy.__dict__)  # our own package source, never user input
    else:
        spec = importlib.util.spec_from_file_location(name, module.__file__)
        copy = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(copy)
    copy.xp = numpy_ops if backend == "numpy" else torch_ops()
    sys.modules[name] = copy
    return copy


def cache_dir() -> Path:
    """Where generated kernel modules (and Numba's cache of them) live."""
    root = os.environ.get("BANDCORE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "bandcore"
    )
    return Path(root) / "numba"


class _LazySelects(ast.NodeTransformer):
    """``xp.where(c, a, b)`` -> ``a if c else b`` and ``xp.logical_and/or`` -> ``and``/``or``."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "xp"):
            return node
        if func.attr == "where" and len(node.args) == 3:
            return ast.IfExp(test=node.args[0], body=node.args[1], orelse=node.args[2])
        if func.attr in ("logical_and", "logical_or") and len(node.args) == 2:
            return ast.BoolOp(op=ast.And() if func.attr == "logical_and" else ast.Or(), values=list(node.args))
        return node


def _body(module: ModuleType, lazy: bool) -> tuple[str, list[str]]:
    """The module's source without its local imports (relative ones and ``__future__``: ``xp`` and the sibling
    sources are bound by the caller), lazy selects applied, and its function names."""
    lines = inspect.getsource(module).splitlines()
    for node in ast.parse("\n".join(lines)).body:
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or node.module == "__future__"):
            lines[node.lineno - 1 : node.end_lineno] = [""] * (node.end_lineno - node.lineno + 1)
    source = "\n".join(lines) + "\n"
    if lazy:
        source = ast.unparse(ast.fix_missing_locations(_LazySelects().visit(ast.parse(source)))) + "\n"
    names = [name for name, value in vars(module).items()
             if inspect.isfunction(value) and value.__module__ == module.__name__]  # fmt: skip
    return source, names


def generated_source(sources: list[tuple[ModuleType, bool]], ops: str, extra: list[str], driver: str, *,
                     inline: bool = False, outlined: tuple[str, ...] = ()) -> str:
    """The Numba module: the :func:`parts` of each ``(module, lazy_selects)`` source, ``extra`` lines (constants,
    generated functions), every part's function jitted (``inline``: marked ``alwaysinline`` for LLVM — Numba's
    ``forceinline`` — so LLVM sees one loop body it can vectorise; Numba's own IR inlining would take minutes on
    these call trees; the functions named in ``outlined`` stay calls), then ``driver`` (which may use ``FASTMATH``)."""
    # Numba's cache keys on this file only: name the ops sources it inlines, so changing them renames the module
    digest = hashlib.sha256(b"".join(Path(m.__file__).read_bytes() for m in _ops_modules(ops))).hexdigest()[:16]
    header = [f"# ops: {ops} {digest}", "import math", "import numpy as np", "from numba import njit, prange",
              f"from bandcore.kernels import {ops} as xp", f"FASTMATH = set({list(FASTMATH)!r})"]  # fmt: skip
    bodies, functions = [_body(slots, False)[0]], []  # the metadata slots' names, constants in the compiled code
    for source, lazy in sources:
        for module in parts(source):
            body, names = _body(module, lazy)
            bodies.append(body)
            functions += names
    options = 'cache=True, fastmath=FASTMATH, error_model="numpy"'
    inlined = f"njit({options}, forceinline=True)" if inline else f"njit({options})"
    jitted = [f"{name} = {f'njit({options})' if name in outlined else inlined}({name})" for name in functions]
    return "\n".join([*header, *bodies, *extra, *jitted, driver])


def _ops_modules(ops: str) -> list[ModuleType]:
    from . import numba_fast_ops, numba_ops

    return [numba_ops] if ops == "numba_ops" else [numba_ops, numba_fast_ops]


def load_generated(source: str, prefix: str) -> ModuleType:
    """Import ``source`` from the cache directory (written atomically once; cached per process)."""
    name = f"{prefix}_{hashlib.sha256(source.encode()).hexdigest()[:20]}"
    with _LOCK:
        if name in sys.modules:
            return sys.modules[name]
        directory = cache_dir()
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}.py"
        if not path.exists() or path.read_text() != source:
            fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
            with os.fdopen(fd, "w") as handle:
                handle.write(source)
            os.replace(tmp, path)  # atomic: concurrent writers produce the same file
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
