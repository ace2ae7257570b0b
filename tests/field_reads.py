"""Which params fields the code reads, resolved through the params object's attribute path.

A read counts for the section whose object it is read from, not for any field of that name: `cfg.analyze.seed`
reads `Analyze.seed` (and not `Params.seed`), `p.n_boot` reads `Boot`'s field only when `p` holds that section.
The type of each name comes from the schema: `stage_params("analyze")` returns (Params, Analyze); a parameter
annotated with a section class (`cfg: Params`, `spec: PlantedReflect`) holds it; `x = <typed expression>`,
`for name, spec in cfg.models.items()`, `self.spec = spec` and a call of a function whose return annotation is
a section carry it on. `getattr(x, "field")` on a typed `x` is a read too. Names are typed per function (a
module's top level is one scope, as a notebook's), flow-insensitively: a name that holds two sections holds
either. A read through an untyped name is not counted: annotate the name.
"""

from __future__ import annotations

import ast
import typing
from collections.abc import Iterable
from pathlib import Path

# A type: a frozenset of ("obj", Section class) / ("map", T) / ("seq", T) / ("tuple", (T, ...)) entries.
Type = frozenset
EMPTY: Type = frozenset()
CONTAINERS = {dict: "map", list: "seq", tuple: "seq", typing.Mapping: "map", typing.Sequence: "seq"}


def sections() -> dict[str, type]:
    """Every Section class reachable from Params, by class name."""
    from biasaudit.params import Params
    from biasaudit.params.base import Section

    found, todo = {"Params": Params}, [Params]
    while todo:
        for info in todo.pop().model_fields.values():
            for cls in _classes(info.annotation):
                if issubclass(cls, Section) and cls.__name__ not in found:
                    found[cls.__name__] = cls
                    todo.append(cls)
    return found


def _classes(annotation) -> Iterable[type]:
    stack = [annotation]
    while stack:
        t = stack.pop()
        if isinstance(t, type):
            yield t
        stack.extend(typing.get_args(t))


def type_of(annotation) -> Type:
    """The Type of a runtime annotation (a field's): sections, and dicts / lists / unions of them."""
    from biasaudit.params.base import Section

    if isinstance(annotation, type) and issubclass(annotation, Section):
        return frozenset({("obj", annotation)})
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_of(args[0])
    kind = CONTAINERS.get(origin) or ("map" if origin is not None and isinstance(origin, type)
                                      and issubclass(origin, dict) else None)
    if kind == "map" and len(args) == 2:
        inner = type_of(args[1])
        return frozenset({("map", inner)}) if inner else EMPTY
    if kind == "seq" and args:
        inner = frozenset().union(*(type_of(a) for a in args if a is not Ellipsis))
        return frozenset({("seq", inner)}) if inner else EMPTY
    out = EMPTY
    for a in args:  # a union (X | None, Optional[X], a discriminated union)
        out |= type_of(a)
    return out


class Reads:
    """The (section class, field) pairs the scanned sources read."""

    def __init__(self) -> None:
        self.schema = sections()
        self.read: set[tuple[str, str]] = set()
        self.where: dict[tuple[str, str], list[str]] = {}
        self.returns: dict[str, Type] = {}  # function name → its annotated return type (any module)
        self.signatures: dict[str, list[list[str]]] = {}  # function name → its parameters' names (per def)
        self.arguments: dict[tuple[str, str], Type] = {}  # (function name, parameter) → the types passed to it
        self.changed = False

    def _flow(self, function: str, param: str, t: Type) -> None:
        old = self.arguments.get((function, param), EMPTY)
        if not t <= old:
            self.arguments[(function, param)] = old | t
            self.changed = True

    # -- annotations written in source -------------------------------------------------------------
    def annotation(self, node: ast.expr | None) -> Type:
        if node is None:
            return EMPTY
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                node = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                return EMPTY
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self.annotation(node.left) | self.annotation(node.right)
        if isinstance(node, ast.Subscript):
            base = ast.unparse(node.value).rpartition(".")[2]
            args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if base in ("dict", "Mapping", "MutableMapping") and len(args) == 2:
                inner = self.annotation(args[1])
                return frozenset({("map", inner)}) if inner else EMPTY
            if base in ("list", "tuple", "Sequence", "Iterable", "Iterator"):
                inner = frozenset().union(*(self.annotation(a) for a in args))
                return frozenset({("seq", inner)}) if inner else EMPTY
            if base in ("Optional", "Union", "Annotated"):
                return frozenset().union(*(self.annotation(a) for a in (args[:1] if base == "Annotated" else args)))
            return EMPTY
        name = ast.unparse(node).rpartition(".")[2]
        cls = self.schema.get(name)
        return frozenset({("obj", cls)}) if cls is not None else EMPTY

    # -- expressions ---------------------------------------------------------------------------------
    def attribute(self, t: Type, attr: str, where: str) -> Type:
        out = EMPTY
        for kind, cls in t:
            if kind == "obj" and attr in cls.model_fields:
                key = (cls.__name__, attr)
                self.read.add(key)
                self.where.setdefault(key, []).append(where)
                out |= type_of(cls.model_fields[attr].annotation)
        return out

    def element(self, t: Type) -> Type:
        """What iterating / indexing a container of `t` gives."""
        out = EMPTY
        for kind, inner in t:
            if kind in ("map", "seq"):
                out |= inner
        return out

    def expr(self, node: ast.expr, env: dict[str, Type], where: str) -> Type:
        if isinstance(node, ast.Name):
            return env.get(node.id, EMPTY)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self" and "self." + node.attr in env:
                return env["self." + node.attr]
            return self.attribute(self.expr(node.value, env, where), node.attr, where)
        if isinstance(node, ast.Subscript):
            return self.element(self.expr(node.value, env, where))
        if isinstance(node, (ast.Tuple, ast.List)):
            parts = tuple(self.expr(e, env, where) for e in node.elts)
            return frozenset({("tuple", parts)}) if any(parts) else EMPTY
        if isinstance(node, ast.IfExp):
            return self.expr(node.body, env, where) | self.expr(node.orelse, env, where)
        if isinstance(node, ast.BoolOp):
            return frozenset().union(*(self.expr(v, env, where) for v in node.values))
        if isinstance(node, ast.NamedExpr):
            return self.expr(node.value, env, where)
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) >= 2 \
                    and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                return self.attribute(self.expr(node.args[0], env, where), node.args[1].value, where)
            if isinstance(func, ast.Name) and func.id == "stage_params" and node.args \
                    and isinstance(node.args[0], ast.Constant):
                params = self.schema["Params"]
                self.attribute(frozenset({("obj", params)}), node.args[0].value, where)  # reads cfg.<section>
                section = type_of(params.model_fields[node.args[0].value].annotation)
                return frozenset({("tuple", (frozenset({("obj", params)}), section))})
            if isinstance(func, ast.Name) and func.id in ("load_params", "validate", "apply_profile"):
                return frozenset({("obj", self.schema["Params"])})
            if isinstance(func, ast.Attribute):
                owner = self.expr(func.value, env, where)
                if func.attr in ("values",):
                    return frozenset({("seq", self.element(owner))}) if self.element(owner) else EMPTY
                if func.attr == "items":
                    inner = self.element(owner)
                    return frozenset({("seq", frozenset({("tuple", (EMPTY, inner))}))}) if inner else EMPTY
                if func.attr == "get":
                    return self.element(owner)
                if func.attr == "model_copy":
                    return owner
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            for k, arg in enumerate(node.args):  # a typed argument types the callee's parameter
                t = self.expr(arg, env, where)
                if t and name in self.signatures:
                    for params in self.signatures[name]:
                        if k < len(params):
                            self._flow(name, params[k], t)
            for kw in node.keywords:
                t = self.expr(kw.value, env, where)
                if t and kw.arg and name in self.signatures:
                    self._flow(name, kw.arg, t)
            if name in self.schema:  # a section built in code: Boot(...), Execution(...)
                return frozenset({("obj", self.schema[name])})
            return self.returns.get(name, EMPTY)
        for child in ast.iter_child_nodes(node):  # other expressions: still read what they hold
            if isinstance(child, ast.expr):
                self.expr(child, env, where)
        return EMPTY

    def bind(self, target: ast.expr, t: Type, env: dict[str, Type]) -> None:
        if isinstance(target, ast.Name):
            if t:
                env[target.id] = env.get(target.id, EMPTY) | t
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            if t:
                env["self." + target.attr] = env.get("self." + target.attr, EMPTY) | t
        elif isinstance(target, (ast.Tuple, ast.List)):
            parts = [inner for kind, inner in t if kind == "tuple"]
            for k, elt in enumerate(target.elts):
                self.bind(elt, frozenset().union(*(p[k] for p in parts if k < len(p))), env)

    # -- scopes --------------------------------------------------------------------------------------
    def scope(self, nodes: list[ast.AST], env: dict[str, Type], where: str, owner: str = "") -> None:
        """Type the names bound in `nodes` (to a fixed point), then record every read in them. In the methods of
        class `owner`, __init__'s parameters are typed by the calls `owner(...)`."""
        for _ in range(4):
            before = dict(env)
            for top in nodes:
                for node in ast.walk(top):
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                        fname = getattr(node, "name", "")
                        fname = owner if owner and fname == "__init__" else fname
                        for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                            t = self.arguments.get((fname, a.arg), EMPTY)
                            if getattr(a, "annotation", None) is not None:
                                t |= self.annotation(a.annotation)
                            self.bind(ast.Name(a.arg), t, env)
                    elif isinstance(node, ast.Assign):
                        t = self.expr(node.value, env, where)
                        for target in node.targets:
                            self.bind(target, t, env)
                    elif isinstance(node, ast.AnnAssign):
                        t = self.annotation(node.annotation)
                        if node.value is not None:
                            t |= self.expr(node.value, env, where)
                        self.bind(node.target, t, env)
                    elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                        self.bind(node.target, self.element(self.expr(node.iter, env, where)), env)
                    elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                        self.bind(node.optional_vars, self.expr(node.context_expr, env, where), env)
            if env == before:
                break
        for top in nodes:
            for node in ast.walk(top):
                if isinstance(node, ast.expr) and not isinstance(getattr(node, "ctx", None), ast.Store):
                    self.expr(node, env, where)

    def scan(self, paths: Iterable[Path], root: Path) -> None:
        trees = {p: ast.parse(p.read_text(encoding="utf-8")) for p in paths}
        for tree in trees.values():  # signatures and return annotations first: a call of any of them is typed
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    args = [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
                    self.signatures.setdefault(node.name, []).append(args[1:] if args[:1] in (["self"], ["cls"])
                                                                    else args)
                    t = self.annotation(node.returns)
                    if t:
                        self.returns[node.name] = self.returns.get(node.name, EMPTY) | t
                elif isinstance(node, ast.ClassDef):  # Class(...) passes its arguments to __init__
                    for init in node.body:
                        if isinstance(init, ast.FunctionDef) and init.name == "__init__":
                            args = [a.arg for a in [*init.args.posonlyargs, *init.args.args]][1:]
                            self.signatures.setdefault(node.name, []).append(args)
        for _ in range(6):  # until the types passed to parameters settle (a typed argument can type a callee's)
            self.changed = False
            self._scan_once(trees, root)
            if not self.changed:
                break

    def _scan_once(self, trees: dict[Path, ast.Module], root: Path) -> None:
        for path, tree in trees.items():
            where = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
            top = [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
            module_env: dict[str, Type] = {}
            self.scope(top, module_env, where)
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.scope([node], dict(module_env), where)
                elif isinstance(node, ast.ClassDef):
                    class_env = dict(module_env)
                    methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
                    for n in node.body:  # class-level annotations (dataclass fields) type self.<name>
                        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                            t = self.annotation(n.annotation)
                            if t:
                                class_env["self." + n.target.id] = t
                    self.scope(methods, class_env, where, node.name)  # self.<x> bound in one method: typed in all
