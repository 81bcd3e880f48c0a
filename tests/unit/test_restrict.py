"""Restricted mode on the host: the static validator, the AST rewrite and the runtime guards run
in-process through the worker's Executor (no fd capture, no subprocess), with the default
policy's python section. Each escape route is refused with the right error_type; ordinary code
runs; pathological input is answered with ``validation``, never a crash."""

from __future__ import annotations

import ast
from collections.abc import Iterator

import pytest

from orchestrator.policy.model import load_policy
from orchestrator.worker.config import WorkerConfig
from orchestrator.worker.errors import GuardError, ImportBlockedError
from orchestrator.worker.executor import CellOutcome, Executor
from orchestrator.worker.restrict import Restrictions
from orchestrator.worker.validator import MAX_DEPTH


def default_config(**overrides: object) -> WorkerConfig:
    policy = load_policy("default")
    fields: dict[str, object] = dict(
        mode="restricted",
        allowed_modules=frozenset(policy.python.allowed_modules),
        forbidden_modules=frozenset(policy.python.forbidden_modules),
        forbidden_builtins=frozenset(policy.python.forbidden_builtins),
        max_code_bytes=policy.python.max_code_bytes,
        max_stream_bytes=policy.output.max_stream_bytes,
        max_reply_bytes=policy.output.max_reply_bytes,
        max_repr_chars=10_000,
        max_result_bytes=policy.output.max_result_bytes,
        persist=False,
    )
    return WorkerConfig(**{**fields, **overrides})  # type: ignore[arg-type]


@pytest.fixture
def executor() -> Iterator[Executor]:
    executor = Executor(default_config())
    assert executor.restrictions is not None
    undo = executor.restrictions.install_process_guards()
    try:
        yield executor
    finally:
        undo()


def run(executor: Executor, code: str) -> CellOutcome:
    return executor.execute(code)


def refused(executor: Executor, code: str, error_type: str) -> CellOutcome:
    outcome = executor.execute(code)
    assert not outcome.success, code
    assert outcome.error_type == error_type, (code, outcome)
    return outcome


# --- ordinary code runs -------------------------------------------------------------------


ORDINARY_CELLS = {
    "classes": (
        "class Base:\n"
        "    def __init__(self, v):\n"
        "        self.__secret = v\n"
        "        self._w = 1\n"
        "    def __repr__(self):\n"
        "        return f'Base({self.__secret})'\n"
        "    def __eq__(self, other):\n"
        "        return isinstance(other, Base) and self.total() == other.total()\n"
        "    __hash__ = None\n"
        "    def total(self):\n"
        "        return self.__secret + self._w\n"
        "class Child(Base):\n"
        "    __slots__ = ('extra',)\n"
        "    def __init__(self):\n"
        "        super().__init__(41)\n"
        "        self.extra = 0\n"
        "        self.extra += 1\n"
        "c = Child()\n"
        "(c.total(), repr(c), c == Child(), type(c).__name__)"
    ),
    "comprehensions, lambdas and generators": (
        "squares = {n: n * n for n in range(5) if n % 2}\n"
        "gen = (x for x in [3, 1, 2])\n"
        "key = lambda item: -item\n"
        "def counter(limit):\n"
        "    n = 0\n"
        "    while n < limit:\n"
        "        yield n\n"
        "        n += 1\n"
        "(squares, sorted(gen, key=key), list(counter(3)), [*{1, 2}])"
    ),
    "f-strings and formatting": (
        "x, items = 3.14159, ['a', 'b']\n"
        "(f'{x:.2f} {items[0]!r} {len(items):>4}', '{0.real} {1}'.format(2, 'z'), "
        "str.format('{}-{}', 1, 2), '{a}'.format_map({'a': 1}))"
    ),
    "dataclasses and decorators": (
        "import dataclasses, functools\n"
        "from dataclasses import dataclass, field\n"
        "@dataclass(frozen=True)\n"
        "class Point:\n"
        "    x: int\n"
        "    y: int = 0\n"
        "    tags: list = field(default_factory=list)\n"
        "@dataclasses.dataclass\n"
        "class Box:\n"
        "    p: Point\n"
        "    @property\n"
        "    def area(self):\n"
        "        return self.p.x * self.p.y\n"
        "    @staticmethod\n"
        "    def unit():\n"
        "        return Box(Point(1, 1))\n"
        "@functools.lru_cache(maxsize=None)\n"
        "def fib(n):\n"
        "    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
        "def deco(f):\n"
        "    @functools.wraps(f)\n"
        "    def inner(*a):\n"
        "        return f(*a) + 1\n"
        "    return inner\n"
        "(Point(1), Box(Point(2, 3)).area, Box.unit().area, fib(30), dataclasses.asdict(Point(5)),"
        " deco(abs).__name__)"
    ),
    "enums, match and named tuples": (
        "import enum, collections, typing\n"
        "class Color(enum.Enum):\n"
        "    RED = 1\n"
        "    BLUE = 2\n"
        "Pair = collections.namedtuple('Pair', 'a b')\n"
        "class Named(typing.NamedTuple):\n"
        "    x: int\n"
        "def describe(value):\n"
        "    match value:\n"
        "        case Color.RED:\n"
        "            return 'red'\n"
        "        case Pair(1, b):\n"
        "            return ('pair', b)\n"
        "        case {'k': Color.BLUE}:\n"
        "            return 'mapping'\n"
        "        case [1, *rest]:\n"
        "            return rest\n"
        "    return None\n"
        "(describe(Color.RED), describe(Pair(1, 2)), describe({'k': Color.BLUE}), describe([1, 2]),"
        " Pair(1, 2)._asdict(), Named(3)._replace(x=4), Color.BLUE.name)"
    ),
    "imports of allowed modules": (
        "from __future__ import annotations\n"
        "import math, json, collections\n"
        "from math import *\n"
        "from collections import Counter as C\n"
        "import typing\n"
        "def f(x: 'int') -> 'list[int]':\n"
        "    return [x]\n"
        "(sqrt(16), json.dumps({'a': 1}), C('aab').most_common(1), typing.get_type_hints(f),"
        " __name__)"
    ),
    "string-built names that are public": (
        "import operator, string\n"
        "get = operator.attrgetter('real', 'imag')\n"
        "call = operator.methodcaller('upper')\n"
        "(get(3), call('x'), string.Formatter().format('{0.real}', 5))"
    ),
}


@pytest.mark.parametrize("code", ORDINARY_CELLS.values(), ids=ORDINARY_CELLS.keys())
def test_ordinary_code_runs_in_restricted_mode(executor: Executor, code: str) -> None:
    outcome = run(executor, code)
    assert outcome.success, outcome
    assert outcome.result_repr


def test_state_and_private_name_mangling_work_across_cells(executor: Executor) -> None:
    assert run(executor, "class K:\n    def __init__(self):\n        self.__v = 7").success
    outcome = run(executor, "class L(K):\n    def get(self):\n        return self._K__v\nL().get()")
    assert outcome.result_repr == "7"


# --- static rules ---------------------------------------------------------------------------


STATIC_VALIDATION = {
    "dunder attribute": "().__class__.__bases__[0].__subclasses__()",
    "dunder name": "__builtins__",
    "dunder import": "__import__('os').system('echo pwned')",
    "forbidden builtin call": "eval('1+1')",
    "forbidden builtin open": "open('/etc/passwd').read()",
    "forbidden builtin as a value": "f = getattr",
    "generator frame": "g = (x for x in ())\ng.gi_frame",
    "frame globals": "def f(fr):\n    return fr.f_globals",
    "traceback frame": "def f(tb):\n    return tb.tb_frame.f_back",
    "code object": "def f(c):\n    return c.co_code",
    "coroutine frame": "async def f():\n    pass\nf().cr_frame",
    "decorator calling a builtin": "@exec\ndef f():\n    pass",
    "decorator through a module": "import math\n@math.floor\ndef f():\n    pass",
    "decorator expression": "@(lambda f: f)\ndef f():\n    pass",
    "global dunder": "def f():\n    global __builtins__",
    "dunder method getattr": "class A:\n    def __getattr__(self, name):\n        return 1",
    "dunder method reduce": "class A:\n    def __reduce__(self):\n        return (print, ())",
    "dunder method class_getitem": "class A:\n    def __class_getitem__(cls, item):\n        pass",
    "dunder method init_subclass": "class A:\n    def __init_subclass__(cls):\n        pass",
    "dunder method del": "class A:\n    def __del__(self):\n        pass",
    "super to a forbidden dunder": (
        "class A:\n    def f(self):\n        return super().__getattribute__('x')"
    ),
    "class pattern on a dunder": "match 1:\n    case int(__class__=c):\n        pass",
    "dunder keyword": "dict(__class__=1)",
    "dunder argument": "def f(__globals__):\n    pass",
    "dunder store": "class A:\n    pass\nA.__init__ = print",
    "private name from-imported": "from random import _os",
}


@pytest.mark.parametrize("code", STATIC_VALIDATION.values(), ids=STATIC_VALIDATION.keys())
def test_escape_routes_are_refused_before_anything_runs(executor: Executor, code: str) -> None:
    outcome = refused(executor, code + "\nran = True", "validation")
    assert outcome.violations
    assert "ran" not in executor.namespace


STATIC_IMPORTS = {
    "forbidden module": "import os",
    "forbidden dotted module": "import os.path",
    "module not allowed": "import zipfile",
    "submodule not listed": "import json.decoder",
    "from forbidden": "from subprocess import run",
    "forbidden submodule by from": "from os import path",
    "relative import": "from . import x",
}


@pytest.mark.parametrize("code", STATIC_IMPORTS.values(), ids=STATIC_IMPORTS.keys())
def test_imports_outside_the_policy_are_import_blocked(executor: Executor, code: str) -> None:
    outcome = refused(executor, code, "import_blocked")
    assert outcome.violations


def test_every_violation_is_listed_with_its_rule_and_line(executor: Executor) -> None:
    code = "x = 1\ny = x.__class__\nimport os\nz = eval('2')\n@exec\ndef f(): pass"
    outcome = refused(executor, code, "validation")
    assert outcome.violations == [
        "line 2: dunder attribute '__class__' is not allowed",
        "line 3: import of 'os' is blocked: module 'os' is forbidden by the policy",
        "line 4: forbidden builtin 'eval' is not allowed",
        "line 5: decorator 'exec' is not allowed",
        "line 5: forbidden builtin 'exec' is not allowed",
    ]


# --- runtime guards -------------------------------------------------------------------------


RUNTIME_IMPORT_BLOCKED = {
    "module attribute that is a forbidden module": "import typing\ntyping.sys",
    "module attribute that is an unlisted submodule": "import json\njson.decoder",
    "from-import of an unlisted submodule": "from json import decoder",
    "format field reaching a module": "import typing\n'{0.sys}'.format(typing)",
    "match value reaching a module": "import typing\nmatch 1:\n    case typing.sys:\n        pass",
    "attrgetter reaching a module": "import operator, typing\noperator.attrgetter('sys')(typing)",
    "string annotation naming a module": (
        "import typing\ndef f(x: 'typing.sys'):\n    pass\ntyping.get_type_hints(f)"
    ),
}


@pytest.mark.parametrize("code", RUNTIME_IMPORT_BLOCKED.values(), ids=RUNTIME_IMPORT_BLOCKED.keys())
def test_modules_reached_at_run_time_are_import_blocked(executor: Executor, code: str) -> None:
    outcome = refused(executor, code, "import_blocked")
    assert outcome.traceback is not None
    assert "guards.py" not in outcome.traceback and "<cell-" in outcome.traceback


RUNTIME_VALIDATION = {
    "private attribute of a module": "import random\nrandom._os",
    "private attribute outside user code": "import enum\nenum.Enum._convert_",
    "private attribute via a user subclass": (
        "import enum\nclass E(enum.Enum):\n    A = 1\nE._convert_"
    ),
    "format traversal to a dunder": "'{0.__class__}'.format(1)",
    "format traversal through str itself": "str.format('{0.__class__}', 1)",
    "format_map traversal": "'{x.__init__.__globals__}'.format_map({'x': 1})",
    "format traversal from a str subclass": (
        "class S(str):\n    pass\nS('{0._private}').format(1)"
    ),
    "format traversal nested in a spec": "'{0:{1.__class__}}'.format(1, 2)",
    "string.Formatter traversal": "import string\nstring.Formatter().format('{0.__class__}', 1)",
    "string.Formatter subclass traversal": (
        "import string\n"
        "class F(string.Formatter):\n"
        "    pass\n"
        "F().vformat('{0.__class__}', (1,), {})"
    ),
    "attrgetter of a dunder": "import operator\noperator.attrgetter('__class__')(1)",
    "attrgetter of a dotted private name": "import operator\noperator.attrgetter('real._x')",
    "attrgetter imported by name": "from operator import attrgetter\nattrgetter('__class__')(1)",
    "methodcaller of a dunder": "import operator\noperator.methodcaller('__reduce_ex__', 2)(1)",
    "methodcaller of str.format": (
        "import operator\noperator.methodcaller('format', 1)('{0.__class__}')"
    ),
    "update_wrapper with a custom list": (
        "import functools\n"
        "class Holder:\n"
        "    pass\n"
        "functools.update_wrapper(Holder(), len, assigned=('__self__',), updated=())"
    ),
    "wraps with a custom list": (
        "import functools\nfunctools.wraps(len, assigned=('__globals__',))"
    ),
    "dataclass with an injected field name": (
        "import dataclasses\n"
        "X = type('X', (), {'_'*2 + 'annotations' + '_'*2: {'a=1': int}})\n"
        "dataclasses.dataclass(X)"
    ),
    "string annotation that is code": (
        "import typing\ndef f(x: '().__class__'):\n    pass\ntyping.get_type_hints(f)"
    ),
    "positional class pattern with injected match args": (
        "import abc, json\n"
        "d = '_' * 2\n"
        "C = type(abc.ABC)('C', (abc.ABC,), {d + 'match_args' + d: (d + 'globals' + d,)})\n"
        "C.register(type(json.dumps))\n"
        "match json.dumps:\n"
        "    case C(g):\n"
        "        pass"
    ),
    "store on a module": "import math\nmath.pi = 3",
    "store on a library class": "import json\njson.JSONEncoder.encode = len",
    "augmented store on a module": "import math\nmath.pi += 1",
    "super over a module": "import math\nsuper(type(math), math).pi",
    "generator internals by format": "g = (i for i in ())\n'{0.gi_frame}'.format(g)",
}


@pytest.mark.parametrize("code", RUNTIME_VALIDATION.values(), ids=RUNTIME_VALIDATION.keys())
def test_runtime_guards_refuse_what_static_checks_cannot_see(executor: Executor, code: str) -> None:
    outcome = refused(executor, code, "validation")
    assert outcome.traceback is not None
    assert "safe_callables.py" not in outcome.traceback
    assert "guards.py" not in outcome.traceback


def test_evaluating_annotations_in_a_callers_dict_writes_nothing_into_it(
    executor: Executor,
) -> None:
    code = (
        "import typing\n"
        "d = {}\n"
        "def f(x: 'int'):\n"
        "    pass\n"
        "(typing.get_type_hints(f, globalns=d), d)"
    )
    assert run(executor, code).result_repr == "({'x': <class 'int'>}, {})"


def test_a_refused_import_can_be_caught_as_import_error(executor: Executor) -> None:
    code = "import json\ntry:\n    json.decoder\nexcept ImportError:\n    caught = True\ncaught"
    assert run(executor, code).result_repr == "True"


def test_the_import_hook_checks_full_names_levels_and_fromlists() -> None:
    config = default_config()
    restrictions = Restrictions(
        allowed_modules=sorted(config.allowed_modules),
        forbidden_modules=sorted(config.forbidden_modules),
        forbidden_builtins=sorted(config.forbidden_builtins),
    )
    with pytest.raises(ImportBlockedError):
        restrictions.import_module("os")
    with pytest.raises(ImportBlockedError):
        restrictions.import_module("json.decoder")
    with pytest.raises(ImportBlockedError):
        restrictions.import_module("json", level=1)
    with pytest.raises(ImportBlockedError):
        restrictions.import_module("json", fromlist=["decoder"])
    with pytest.raises(ImportBlockedError):
        restrictions.import_module("random", fromlist=["_os"])
    namespace = restrictions.import_module("json", fromlist=["dumps"])
    assert namespace.dumps({"a": 1}) == '{"a": 1}'  # type: ignore[attr-defined]


def test_a_listed_submodule_may_be_imported_and_reached() -> None:
    executor = Executor(default_config(allowed_modules=frozenset({"json", "json.decoder"})))
    outcome = run(
        executor, "import json.decoder\nfrom json import decoder\njson.decoder is decoder"
    )
    assert outcome.result_repr == "True"


def test_guarded_builtins_replace_getattr_and_friends_when_the_policy_allows_them() -> None:
    allowed = {"getattr", "setattr", "delattr", "vars", "dir"}
    forbidden = default_config().forbidden_builtins - allowed
    executor = Executor(default_config(forbidden_builtins=forbidden))
    prelude = "import math, typing\nclass Box:\n    pass\nb = Box()\n"
    assert run(executor, prelude + "getattr(b, 'missing', 5)").result_repr == "5"
    assert run(executor, prelude + "setattr(b, 'v', 1)\nvars(b)").result_repr == "{'v': 1}"
    assert run(executor, prelude + "[n for n in dir(1) if n.startswith('_')]").result_repr == "[]"
    refused(executor, prelude + "getattr(1, '__class__')", "validation")
    refused(executor, prelude + "getattr(math, '_private', None)", "validation")
    refused(executor, prelude + "getattr(typing, 'sys')", "import_blocked")
    refused(executor, prelude + "setattr(math, 'pi', 3)", "validation")
    refused(executor, prelude + "delattr(b, '__dict__')", "validation")
    refused(executor, prelude + "vars(math)", "validation")
    refused(executor, prelude + "vars()", "validation")


def test_a_forbidden_builtin_reached_through_a_module_is_a_stub() -> None:
    executor = Executor(
        default_config(allowed_modules=frozenset({"io"}), forbidden_modules=frozenset())
    )
    outcome = refused(executor, "import io\nio.open('/etc/hostname')", "validation")
    assert "open" in (outcome.error_message or "")


def test_user_exceptions_keep_their_class_name_and_only_cell_frames(executor: Executor) -> None:
    assert run(executor, "def boom():\n    return 1 / 0").success
    outcome = refused(executor, "import json\nboom()", "ZeroDivisionError")
    assert outcome.traceback is not None
    assert outcome.traceback.count('File "<cell-') == 2
    assert "executor.py" not in outcome.traceback


def test_a_user_exception_cannot_pose_as_a_stable_error_type(executor: Executor) -> None:
    outcome = refused(
        executor, "class timeout(Exception):\n    pass\nraise timeout()", "__main__.timeout"
    )
    assert outcome.error_message == ""


# --- pathological input ---------------------------------------------------------------------


PATHOLOGICAL = {
    "nested parentheses": "(" * 5000 + ")" * 5000,
    "nested lists": "x = " + "[" * 3000 + "]" * 3000,
    "long unary chain": "-" * 50_000 + "1",
    "long attribute chain": "x" + ".a" * 50_000,
    "long binary chain": "1" + "+1" * 50_000,
    "attribute chain past the depth limit": "x" + ".a" * (MAX_DEPTH + 50),
    "null byte": "a = 1\0",
    "lone surrogate": "s = '\ud800'",
    "too large": "x = 1\n" * 20_000,
}


@pytest.mark.parametrize("code", PATHOLOGICAL.values(), ids=PATHOLOGICAL.keys())
def test_pathological_input_is_a_validation_error_not_a_crash(
    executor: Executor, code: str
) -> None:
    outcome = refused(executor, code, "validation")
    assert outcome.error_message
    assert run(executor, "40 + 2").result_repr == "42"


def test_the_validator_walks_iteratively_whatever_the_depth() -> None:
    config = default_config()
    restrictions = Restrictions(
        allowed_modules=sorted(config.allowed_modules),
        forbidden_modules=sorted(config.forbidden_modules),
        forbidden_builtins=sorted(config.forbidden_builtins),
    )
    tree: ast.expr = ast.Name("x", ast.Load())
    for _ in range(100_000):
        tree = ast.Attribute(tree, "a", ast.Load())
    violations = restrictions.check(ast.Module([ast.Expr(tree)], []))
    assert [violation.kind for violation in violations] == ["validation"]


def test_syntax_errors_keep_their_class_name(executor: Executor) -> None:
    outcome = refused(executor, "this is not valid python syntax", "SyntaxError")
    assert outcome.traceback and "<cell-" in outcome.traceback


def test_guard_errors_are_exceptions_of_the_documented_kinds() -> None:
    assert issubclass(ImportBlockedError, ImportError)
    assert ImportBlockedError.error_type == "import_blocked"
    assert GuardError.error_type == "validation"


@pytest.mark.parametrize("name", ["numpy", "pandas.io", "matplotlib.pyplot", "scipy", "PIL"])
def test_data_libraries_are_refused_in_restricted_mode_even_when_listed(name: str) -> None:
    listed = frozenset(default_config().allowed_modules | {name.split(".")[0], name})
    executor = Executor(default_config(allowed_modules=listed))
    outcome = executor.execute(f"import {name}")
    assert not outcome.success and outcome.error_type == "import_blocked", outcome
    assert "python-data policy" in (outcome.error_message or "")
