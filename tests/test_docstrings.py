"""Every dotted name that the tool's and the harness's docstrings and
comments cite in double backticks names code that exists.

The rule, for each module ``M`` of keras_fork/ and integration_tests/harness/:

* Scanned: every bare string statement (module, class, function and
  attribute docstrings) and every comment of ``M``.
* A reference: the whole text between a pair of double backticks, when it
  is two or more identifiers joined by dots (``fixes.verdict``,
  ``harness.topologies.TOPOLOGIES``); a text with anything else in it (a
  space, a call, a ``/``) is not one.
* Not checked: a file name (its last part is a file extension:
  ``fix.toml``, ``conftest.py``); a name of Keras or a backend
  (``keras.``, ``tf.``, ``np.``, ``jax.``, ``torch.``: not installed, or
  slow to import, where this runs); a git config key (``user.email``); and
  an instance's attribute, whose first part is no module nor a name of
  ``M`` but a parameter of a function of ``M`` (``args.base``,
  ``layout.cache``, ``self.x``).
* Otherwise the first part is looked up as a top-level name of ``M`` (what
  ``M`` defines or imports at top level), as a module ``<package>.<part>``
  of each package of keras_fork and integration_tests (``keras_fork``,
  ``keras_fork.proof``, ..., ``integration_tests.harness``), and as an
  importable top-level module (the standard library, pytest). The
  reference resolves when one of those has the rest as attributes, one
  after the other: an attribute, a dataclass field or annotated class
  attribute, or a submodule of a package. One that resolves nowhere, or
  whose first part is none of those, is rotten.

Only the modules that a reference may name are imported (the tool's, the
harness's, the standard library's): recorders.py, which imports keras, is
read but not imported, and a reference into it would be rotten.
"""

import ast
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import io
import re
import tokenize
from pathlib import Path

from keras_fork.recipe import pins

ROOT = pins.CODE_ROOT
SOURCES = ("keras_fork", "integration_tests/harness")
PACKAGES = (
    "keras_fork",
    "keras_fork.bench",
    "keras_fork.proof",
    "keras_fork.recipe",
    "keras_fork.upstream",
    "integration_tests",
    "integration_tests.harness",
)
REFERENCE = re.compile(r"``([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)``")
# The last part of a file name, not of a dotted Python name.
EXTENSIONS = frozenset(
    "c cfg gz ini json lock md patch py sh toml tsv txt whl xml yaml".split()
)
# Keras and the backends, cited by their public names (``tf.distribute``).
FRAMEWORKS = frozenset("keras tf tensorflow np numpy jax torch".split())
# First parts that are no Python name: git config sections.
NOT_CODE = frozenset({"user"})


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``SOURCES``."""
    files = {}
    for source in SOURCES:
        for path in sorted((ROOT / source).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join(parts)] = path
    return files


def references(text: str) -> list[tuple[int, str]]:
    """``(line, reference)`` of each reference in the docstrings and
    comments of the module source ``text``."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            for m in REFERENCE.finditer(node.value.value):
                line = node.lineno + node.value.value.count("\n", 0, m.start())
                found.append((line, m.group(1)))
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            for m in REFERENCE.finditer(token.string):
                found.append((token.start[0], m.group(1)))
    return found


def top_level_names(module: str, body: list[ast.stmt]) -> dict[str, str]:
    """Each name that the statements ``body`` of ``module`` bind at top
    level (inside ``if`` and ``try`` too) -> the dotted path of what it
    names: an import's target, else ``module.<name>``."""
    names = {}
    for node in body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:  # import a.b as c: c is a.b
                    names[alias.asname] = alias.name
                else:  # import a.b: a is a
                    top = alias.name.partition(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.rsplit(".", node.level)[0]
                base = f"{package}.{base}" if node.module else package
            for alias in node.names:
                names[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = f"{module}.{node.name}"
        elif isinstance(node, ast.ClassDef):
            names[node.name] = f"{module}.{node.name}"
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets or [node.target]:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names[name.id] = f"{module}.{name.id}"
        elif isinstance(node, (ast.If, ast.Try)):
            for block in (
                node.body,
                node.orelse,
                getattr(node, "finalbody", []),
            ):
                names.update(top_level_names(module, block))
    return names


def parameters(tree: ast.Module) -> set[str]:
    """The parameter names of every function (and lambda) in ``tree``."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arguments):
            args = node.posonlyargs + node.args + node.kwonlyargs
            args += [a for a in (node.vararg, node.kwarg) if a]
            found |= {a.arg for a in args}
    return found


def _has(obj, name: str) -> bool:
    """Whether ``obj`` has attribute ``name``; a class also has its
    dataclass fields and annotated attributes, which need no default."""
    if hasattr(obj, name):
        return True
    if not inspect.isclass(obj):
        return False
    if dataclasses.is_dataclass(obj):
        if name in {f.name for f in dataclasses.fields(obj)}:
            return True
    return any(name in vars(c).get("__annotations__", {}) for c in obj.__mro__)


@functools.cache
def resolves(path: str) -> bool:
    """Whether the dotted ``path`` names a module, or an attribute chain
    from one."""
    parts = path.split(".")
    try:
        obj = importlib.import_module(parts[0])
    except ImportError:
        return False
    for i, part in enumerate(parts[1:], start=1):
        if _has(obj, part):
            obj = getattr(obj, part, None)
            continue
        if inspect.ismodule(obj) and hasattr(obj, "__path__"):
            name = ".".join(parts[: i + 1])
            if importlib.util.find_spec(name) is not None:
                obj = importlib.import_module(name)
                continue
        return False
    return True


def candidates(first: str, names: dict[str, str]) -> list[str]:
    """The dotted paths that the first part of a reference may name: a
    top-level name of the citing module (``names``), a module of a package
    of ``PACKAGES``, an importable top-level module."""
    found = [names[first]] if first in names else []
    found += [f"{p}.{first}" for p in PACKAGES if f"{p}.{first}" in MODULES]
    if importlib.util.find_spec(first) is not None:
        found.append(first)
    return list(dict.fromkeys(found))


def rotten(module: str, text: str) -> list[tuple[int, str, str]]:
    """``(line, reference, why)`` of each rotten reference in the source
    ``text`` of ``module``."""
    tree = ast.parse(text)
    names = top_level_names(module, tree.body)
    instances = parameters(tree)
    bad = []
    for line, ref in references(text):
        first, _, rest = ref.partition(".")
        if ref.rsplit(".", 1)[1] in EXTENSIONS:
            continue
        if first in FRAMEWORKS | NOT_CODE:
            continue
        found = candidates(first, names)
        if not found and first in instances:
            continue
        if not any(resolves(f"{c}.{rest}") for c in found):
            if found:
                why = f"no {rest} in {' or '.join(found)}"
            else:
                why = f"{first} is no module nor name of {module}"
            bad.append((line, ref, why))
    return bad


MODULES = module_files()


def test_every_docstring_reference_resolves():
    """A rotten one: cite the name where it lives now, by its module's
    name (``cells.verdict``), or drop the backticks if it is no code."""
    assert "keras_fork.proof.prove" in MODULES
    assert "integration_tests.harness.verify" in MODULES
    bad = [
        f"{path.relative_to(ROOT)}:{line}: ``{ref}``: {why}"
        for module, path in MODULES.items()
        for line, ref, why in rotten(module, path.read_text())
    ]
    assert not bad, "\n".join(bad)


def test_the_check_sees_a_rotten_reference():
    """A module of keras_fork/proof/ citing a moved name (``fixes.verdict``,
    now ``cells.verdict``), a name that is nowhere and missing attributes;
    the parameter's, file's and framework's references are not checked."""
    text = '''"""``fixes.verdict`` and ``cells.verdict``; ``fix.toml``."""

from keras_fork.recipe import pins

# ``pins.Layout.fixes``, ``pins.Layout.nosuch``


def f(args):
    """``args.base``, ``nosuch.name``, ``tf.distribute``,
    ``keras_fork.proof.cells.Cell.stock_side``, ``os.path.join``,
    ``harness.topologies.TOPOLOGIES`` and ``harness.nosuch``."""
'''
    name = "keras_fork.proof.example"
    assert sorted(rotten(name, text)) == [
        (1, "fixes.verdict", "no verdict in keras_fork.proof.fixes"),
        (5, "pins.Layout.nosuch", "no Layout.nosuch in keras_fork.recipe.pins"),
        (9, "nosuch.name", f"nosuch is no module nor name of {name}"),
        (11, "harness.nosuch", "no nosuch in integration_tests.harness"),
    ]
