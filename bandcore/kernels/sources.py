r"""How the one ``xp`` source (:mod:`.lookup`, the parts of :mod:`.solvers`) becomes a NumPy/torch module or Numba code.

Both are one text: the bodies of the source modules concatenated, in order, without their relative imports (the
names those import are defined earlier in the text, or given), after :mod:`.slots` (the names of the tables'
metadata slots):

* :func:`vectorised_module`: the text executed once into a fresh module with ``xp`` bound to :data:`.ops.numpy_ops`
  or :func:`.ops.torch_ops` and any names given beforehand (a generic plan's functions and constants), registered
  in ``sys.modules`` under a name of its own (torch.compile looks globals up by module name);
* :func:`generated_source` / :func:`load_generated`: the text with ``xp`` bound to :mod:`.numba_fast_ops`, every
  function wrapped in ``njit(cache=True)``, plus drivers, written once to the cache (:mod:`bandcore._cache`, folder
  ``numba``, named by a hash of the text) and imported from there, so that Numba caches its machine code on disk.

**Damaged cache files.**  Numba reads its files of a module (an index ``*.nbi`` and data ``*.nbc`` per function,
pickles) on the first call of each signature, and a truncated or damaged one raises there (``UnpicklingError``,
``EOFError``, ...).  :func:`call_generated` makes that first call guarded: on any exception it deletes Numba's
files of the module, imports the module afresh (Numba then compiles it again) and calls once more; a second
failure is raised.  Processes that start at once on a cold cache compile a signature once: its first call holds
the lock ``<module>.<signature>.lock`` (:func:`bandcore._cache.exclusive`), so the others wait and load the machine
code the first one cached.  After a signature's first call succeeds, a marker file ``<module>.<signature>.ready`` is put
beside the module: :func:`is_ready` tells whether a signature runs without a compile, in this process or (Numba's
cache being on disk) in the next.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import linecache
import sys
import threading
from collections.abc import Callable
from functools import cache, lru_cache
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

from .._cache import cache_root, exclusive, write_atomic
from . import slots

__all__ = ["FASTMATH", "NUMBA_FOLDER", "call_generated", "compile_for", "fuse_multiply_adds", "generated_name",
           "generated_source", "is_ready", "load_generated", "vectorised_module"]

#: LLVM fast-math flags that keep NaN/inf semantics (full fastmath breaks isnan and inf comparisons).
FASTMATH = ("arcp", "contract", "nsz")
#: The element-wise namespaces of the compiled code, by name: the files whose text it inlines
_OPS_FILES = {"numba_ops": ("numba_ops.py",), "numba_fast_ops": ("numba_ops.py", "numba_fast_ops.py")}
#: Cache folder of the generated modules
NUMBA_FOLDER = "numba"
_LOCK = threading.Lock()


@cache
def _body(module: ModuleType) -> tuple[str, tuple[str, ...]]:
    """The module's source without its relative imports and ``__future__`` (their names are defined before it in
    the concatenated text, or given), and the names of its functions; read and parsed once per module (a plan
    bound to a new δ asks for its generated source again)."""
    lines = inspect.getsource(module).splitlines()
    for node in ast.parse("\n".join(lines)).body:
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or node.module == "__future__"):
            lines[node.lineno - 1 : node.end_lineno] = [""] * (node.end_lineno - node.lineno + 1)
    names = [name for name, value in vars(module).items()
             if inspect.isfunction(value) and value.__module__ == module.__name__]  # fmt: skip
    return "\n".join(lines) + "\n", tuple(names)


def vectorised_module(modules: tuple[ModuleType, ...], xp: Any, name: str, given: dict[str, Any]) -> ModuleType:
    """One module of the bodies of :mod:`.slots` and ``modules``, executed with ``xp`` and the ``given`` names bound
    first (cached in ``sys.modules`` under ``name``), compiled for ``xp`` (:func:`compile_for`)."""
    with _LOCK:
        if name in sys.modules:
            return sys.modules[name]
        source = "".join(_body(module)[0] for module in (slots, *modules))
        filename = f"<{name}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
        module = ModuleType(name, modules[-1].__doc__)
        module.__dict__.update(given, xp=xp)
        exec(compile_for(xp, source, filename), module.__dict__)  # the package's own source (see the docstring)
        sys.modules[name] = module
        return module


def compile_for(xp: Any, source: str, filename: str) -> CodeType:
    """``source`` compiled to run on namespace ``xp``: where ``xp`` has ``integer_power`` (NumPy, torch), its
    integer powers rewritten to it (:func:`integer_powers`); where it has ``muladd`` (torch), its multiply-adds
    fused (:func:`fuse_multiply_adds`)."""
    tree = ast.parse(source)
    if hasattr(xp, "integer_power"):
        tree = _IntegerPowers().visit(tree)
    if hasattr(xp, "muladd"):
        tree = _MultiplyAdds().visit(tree)
    return compile(ast.fix_missing_locations(tree), filename, "exec")


#: The integer exponents :func:`integer_powers` rewrites (a**2 is a product already in NumPy and torch).
INTEGER_POWERS = range(3, 33)


def integer_powers(source: str) -> ast.Module:
    """``source`` parsed, with every ``a ** n`` for an integer literal n in :data:`INTEGER_POWERS` replaced by
    ``xp.integer_power(a, n)`` (repeated squaring, not a general ``pow``).  Line numbers are kept."""
    return ast.fix_missing_locations(_IntegerPowers().visit(ast.parse(source)))


class _IntegerPowers(ast.NodeTransformer):
    """The rewrite of :func:`integer_powers`."""

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        exponent = node.right
        if (isinstance(node.op, ast.Pow) and isinstance(exponent, ast.Constant) and type(exponent.value) is int
                and exponent.value in INTEGER_POWERS):  # fmt: skip
            function = ast.Attribute(ast.Name("xp", ast.Load()), "integer_power", ast.Load())
            return ast.copy_location(ast.Call(function, [node.left, exponent], []), node)
        return node


def fuse_multiply_adds(source: str) -> ast.Module:
    """``source`` parsed, with every ``c + a*b``, ``a*b + c`` and ``c - a*b``, and ``a*b - k`` for a number ``k``,
    replaced by ``xp.muladd(c, a, b[, -1.0])`` (innermost first; operands evaluated once each, as before): for the
    torch binding, where each is then one operation (``addcmul``) instead of two.  Line numbers are kept."""
    return ast.fix_missing_locations(_MultiplyAdds().visit(ast.parse(source)))


class _MultiplyAdds(ast.NodeTransformer):
    """The rewrite of :func:`fuse_multiply_adds`."""

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, ast.Add) and (_is_product(node.right) or _is_product(node.left)):
            addend, product = (node.left, node.right) if _is_product(node.right) else (node.right, node.left)
            return _muladd(node, addend, product)
        if isinstance(node.op, ast.Sub) and _is_product(node.right):
            return _muladd(node, node.left, node.right, negative=True)
        if isinstance(node.op, ast.Sub) and _is_product(node.left) and _is_number(node.right):
            return _muladd(node, ast.UnaryOp(ast.USub(), node.right), node.left)
        return node


def _is_product(node: ast.AST) -> bool:
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)


def _is_number(node: ast.AST) -> bool:
    """Whether ``node`` is arithmetic on numeric literals only (a constant of the source, e.g. ``3/8``)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, (ast.USub, ast.UAdd)) and _is_number(node.operand)
    return isinstance(node, ast.BinOp) and _is_number(node.left) and _is_number(node.right)


def _muladd(node: ast.BinOp, addend: ast.AST, product: ast.BinOp, negative: bool = False) -> ast.Call:
    function = ast.Attribute(ast.Name("xp", ast.Load()), "muladd", ast.Load())
    arguments = [addend, product.left, product.right] + ([ast.Constant(-1.0)] if negative else [])
    return ast.copy_location(ast.Call(function, arguments, []), node)


def generated_source(modules: list[ModuleType], ops: str, extra: list[str], driver: str, *, inline: bool = False,
                     outlined: tuple[str, ...] = ()) -> str:
    """The Numba module: the bodies of :mod:`.slots` and ``modules``, ``extra`` lines (constants, generated
    functions), every module function jitted (``inline``: marked ``alwaysinline`` for LLVM — Numba's
    ``forceinline`` — so LLVM sees one loop body it can vectorise; Numba's own IR inlining would take minutes on
    these call trees; the functions named in ``outlined`` stay calls), then ``driver`` (which may use ``FASTMATH``)."""
    # Numba's cache keys on this file only: name the ops sources it inlines, so changing them renames the module
    here = Path(__file__).parent
    digest = hashlib.sha256(b"".join((here / file).read_bytes() for file in _OPS_FILES[ops])).hexdigest()[:16]
    header = [f"# ops: {ops} {digest}", "import math", "import numpy as np", "from numba import njit, prange",
              f"from bandcore.kernels import {ops} as xp", f"FASTMATH = set({list(FASTMATH)!r})"]  # fmt: skip
    bodies, functions = [_body(slots)[0]], []
    for module in modules:
        body, names = _body(module)
        bodies.append(body)
        functions += names
    options = 'cache=True, fastmath=FASTMATH, error_model="numpy"'
    inlined = f"njit({options}, forceinline=True)" if inline else f"njit({options})"
    jitted = [f"{name} = {f'njit({options})' if name in outlined else inlined}({name})" for name in functions]
    return "\n".join([*header, *bodies, *extra, *jitted, driver])


@lru_cache(maxsize=256)
def generated_name(source: str, prefix: str) -> str:
    """The module name (and file stem) of a generated ``source``; remembered per text, as the table lookup asks for
    it on every call (``docs/kernel_measurements.md``)."""
    return f"{prefix}_{hashlib.sha256(source.encode()).hexdigest()[:20]}"


def load_generated(source: str, prefix: str) -> ModuleType:
    """Import ``source`` from the cache (written atomically when missing or different; cached per process)."""
    name = generated_name(source, prefix)
    with _LOCK:
        if name in sys.modules:
            return sys.modules[name]
        path = write_generated(source, name)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module


def write_generated(source: str, name: str) -> Path:
    """The path of ``name``'s file holding ``source`` in the cache, (re)written unless it holds it already (a file
    rewritten with the same text would only lose Numba's cache of it, which is keyed by the file's time stamp)."""
    path = cache_root() / NUMBA_FOLDER / f"{name}.py"
    try:
        if path.read_text(encoding="utf-8") == source:
            return path
    except (OSError, UnicodeDecodeError):
        pass  # missing, unreadable, or damaged (not UTF-8): written again
    return write_atomic(NUMBA_FOLDER, f"{name}.py", source.encode("utf-8"))


#: (module name, signature) whose first call succeeded in this process
_RAN: set[tuple[str, str]] = set()


def _marker(name: str, signature: str) -> str:
    return f"{name}.{signature}.ready"


def is_ready(name: str, signature: str) -> bool:
    """Whether ``signature`` of the generated module ``name`` ran in this process or on this cache (no compile)."""
    return (name, signature) in _RAN or (cache_root() / NUMBA_FOLDER / _marker(name, signature)).is_file()


def call_generated(module: ModuleType, source: str, prefix: str, signature: str, call: Callable[[ModuleType], Any]
                   ) -> tuple[ModuleType, Any]:
    """``(module, call(module))``, the first call of ``signature`` in this process guarded (module docstring): the
    module returned is the one to use from then on."""
    if (module.__name__, signature) in _RAN:
        return module, call(module)
    with exclusive(NUMBA_FOLDER, f"{module.__name__}.{signature}.lock"):  # one compile across processes
        try:
            result = call(module)
        except Exception:
            module = _reloaded(module, source, prefix)
            result = call(module)
    with _LOCK:
        _RAN.add((module.__name__, signature))
    try:
        write_atomic(NUMBA_FOLDER, _marker(module.__name__, signature), b"")
    except OSError:
        pass  # only the next process's choice of backend depends on it
    return module, result


def _numba_files(module: ModuleType) -> list[Path]:
    """Numba's cache files of ``module``'s functions (in Numba's cache folder of the module's file)."""
    folders = {Path(module.__file__).parent / "__pycache__"}
    for value in vars(module).values():
        cache = getattr(value, "_cache", None)  # a Dispatcher's cache (private in Numba; a test guards it)
        if getattr(cache, "cache_path", None):
            folders.add(Path(cache.cache_path))
    stem = Path(module.__file__).stem
    return [path for folder in folders if folder.is_dir() for path in folder.glob(f"{stem}.*")
            if path.suffix in (".nbi", ".nbc")]  # fmt: skip


def _reloaded(module: ModuleType, source: str, prefix: str) -> ModuleType:
    """The module of ``source`` imported afresh after deleting Numba's cache files of ``module``."""
    for path in _numba_files(module):
        path.unlink(missing_ok=True)
    with _LOCK:
        sys.modules.pop(module.__name__, None)
    return load_generated(source, prefix)
