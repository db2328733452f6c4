"""docs/api-parity.md's Python column against the code.

Every cell of the "substrax (Python)" column that names a ``substrax.`` function is a signature:
the function must exist and its parameters (names, defaults, ``*``) must read exactly as the
cell does. The guide's column must use the function's own argument names (those it shows are
parameters, in order), every public function of substrax.spmd and of DeviceMeshManager must
have a row, and no row may name a substrax function that is not there. The C++ column's
functions (``Name(`` or ``Class::Name(``) must be declared in a header its row names.
"""

from __future__ import annotations

import conftest_spmd

conftest_spmd.require_jax()

import importlib  # noqa: E402
import inspect  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from substrax import spmd  # noqa: E402
from substrax.mesh import DeviceMeshManager  # noqa: E402

PARITY = Path(__file__).resolve().parents[2] / "docs" / "api-parity.md"
PYTHON_COLUMN = "substrax (Python)"
GUIDE_COLUMN = "guide (Python)"
SIGNATURE = re.compile(r"`(substrax\.[\w.]+)\((.*?)\)`")
GUIDE_CALL = re.compile(r"`(?:DeviceMeshManager\.)?(\w+)\((.*?)\)`")
CPP_COLUMN = "substrax (C++)"
CPP_CALL = re.compile(r"`(?:\w+::)*(\w+)\(")
HEADER = re.compile(r"`([\w/]+\.h)`")


def table_rows() -> list[dict[str, str]]:
    """The rows of the page's first table, as column name -> cell text."""
    lines = [line for line in PARITY.read_text().splitlines() if line.startswith("|")]
    split = lambda line: [cell.strip() for cell in line.strip().strip("|").split(" | ")]  # noqa: E731
    header = split(lines[0])
    assert PYTHON_COLUMN in header and GUIDE_COLUMN in header, header
    return [dict(zip(header, split(line))) for line in lines[2:]]


def resolve(dotted: str) -> object:
    """``substrax.spmd.reduce_mean`` or ``substrax.mesh.DeviceMeshManager.get_mesh_info``."""
    parts = dotted.split(".")
    for split_at in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split_at]))
        except ImportError:
            continue
        for name in parts[split_at:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def parameters_text(function: object) -> str:
    """The parameters as the page writes them: ``a, b=1, *, c=False`` (no annotations)."""
    out = []
    star = False
    for p in inspect.signature(function).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            out.append("*")
            star = True
        text = p.name if p.default is p.empty else f"{p.name}={p.default!r}"
        out.append(("*" if p.kind is p.VAR_POSITIONAL else "") + text)
    return ", ".join(out)


def documented() -> list[tuple[str, str, str]]:
    """(dotted name, documented parameters, guide cell) for every substrax signature."""
    found = []
    for row in table_rows():
        for dotted, params in SIGNATURE.findall(row[PYTHON_COLUMN]):
            found.append((dotted, params, row[GUIDE_COLUMN]))
    return found


def test_the_python_column_exists_and_names_functions() -> None:
    assert len(documented()) >= 17


@pytest.mark.parametrize(("dotted", "params", "guide"), documented(),
                         ids=[d for d, _, _ in documented()])
def test_documented_signature_matches_the_code(dotted: str, params: str, guide: str) -> None:
    function = resolve(dotted)
    assert callable(function), dotted
    assert params == parameters_text(function), (
        f"docs/api-parity.md writes {dotted}({params}); the code has "
        f"{dotted}({parameters_text(function)})")
    # The guide's argument names are the function's, in the same order.
    names = list(inspect.signature(function).parameters)
    short = dotted.rsplit(".", 1)[-1]
    for called, args in GUIDE_CALL.findall(guide):
        if called != short:
            continue
        guide_names = [a.split("=")[0].strip() for a in args.split(",") if a.strip()]
        assert guide_names == [n for n in names if n in guide_names], (
            f"the guide calls {short}({args}); {dotted} has parameters {names}")


def test_every_public_function_has_a_row() -> None:
    names = {d for d, _, _ in documented()}
    public = {f"substrax.spmd.{n}" for n, f in vars(spmd).items()
              if inspect.isfunction(f) and not n.startswith("_") and f.__module__ == spmd.__name__}
    public |= {f"substrax.mesh.DeviceMeshManager.{n}" for n in vars(DeviceMeshManager)
               if not n.startswith("_")}
    assert public - names == set(), "functions missing from docs/api-parity.md's Python column"


def header_path(name: str) -> Path:
    """``substrax/x.h`` (an SDK header, in some package's include/) or a repository path."""
    root = PARITY.parents[1]
    if name.startswith("substrax/"):
        found = sorted(root.glob(f"*/include/{name}")) + sorted(root.glob(f"*/*/include/{name}"))
        assert found, f"docs/api-parity.md names {name}, which no include/ directory has"
        return found[0]
    assert (root / name).is_file(), f"docs/api-parity.md names {name}, which does not exist"
    return root / name


def test_cpp_functions_are_declared_in_their_headers() -> None:
    checked = 0
    for row in table_rows():
        headers = [header_path(h).read_text() for h in HEADER.findall(row["header"])]
        for name in CPP_CALL.findall(row[CPP_COLUMN]):
            assert any(re.search(rf"\b{name}\b", text) for text in headers), (
                f"{name} (docs/api-parity.md) is in none of {HEADER.findall(row['header'])}")
            checked += 1
    assert checked >= 20
