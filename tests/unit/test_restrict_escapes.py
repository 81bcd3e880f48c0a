"""The escape families of issue 14.1, in-process through the worker's Executor with the default
policy's python section and the process patches installed, ``__main__`` being the session's
module as in the worker. Each family is refused at its root cause with a stable error_type;
classes made past the class-body rule by a higher-order C callable cannot be used to get out;
the ordinary code of each family still runs. The same routes run against real containers in
policies/tests/python_escapes.toml."""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from orchestrator.worker import transform
from orchestrator.worker.executor import CellOutcome, Executor
from orchestrator.worker.modpolicy import ModulePolicy
from orchestrator.worker.rules import exact_str
from tests.unit.test_restrict import default_config

# A str whose methods lie: it passes every name check a guard could make with them.
LYING_STR = """
class S(str):
    def __getitem__(self, index):
        return 'x'
    def split(self, *args, **kwargs):
        return [self]
    def startswith(self, *args):
        return False
    def __contains__(self, item):
        return False
    def __ne__(self, other):
        return False
    def __eq__(self, other):
        return True
    def __hash__(self):
        return hash('json')
d = '_' * 2
"""
DUNDER = "d = '_' * 2\n"


def made(name: str, namespace: dict[str, object], bases: tuple[type, ...] = ()) -> type:
    """A class made past every check of the class-body rule, as a way not yet known would make
    it: the host makes it and hands it to the cell as ``made``."""
    return type(name, bases, namespace)


@contextmanager
def restricted_executor(**config_overrides: object) -> Iterator[Executor]:
    executor = Executor(default_config(**config_overrides))
    assert executor.restrictions is not None
    undo = executor.restrictions.install_process_guards()
    previous = sys.modules["__main__"]
    sys.modules["__main__"] = executor.module  # as repl_worker.main does
    try:
        yield executor
    finally:
        sys.modules["__main__"] = previous
        undo()


@pytest.fixture
def executor() -> Iterator[Executor]:
    with restricted_executor() as made:
        yield made


def refused(executor: Executor, code: str, error_type: str) -> CellOutcome:
    outcome = executor.execute(code + "\nreached = True")
    assert not outcome.success, (code, outcome)
    assert outcome.error_type == error_type, (code, outcome)
    assert "reached" not in executor.namespace
    if outcome.traceback is not None:  # refused while running: only the cell's frames shown
        assert "<cell-" in outcome.traceback and "guards.py" not in outcome.traceback
    return outcome


# --- the routes of the report, and more of each family ----------------------------------


ESCAPES = {
    # str subclasses that lie to name checks
    "attrgetter of a lying __globals__": (
        LYING_STR
        + "import operator\ndef f():\n    pass\noperator.attrgetter(S(d + 'globals' + d))(f)",
        "validation",
    ),
    "attrgetter of a lying dotted path": (
        LYING_STR + "import operator\ndef f():\n    pass\n"
        "operator.attrgetter(S('x.' + d + 'globals' + d))(f)",
        "validation",
    ),
    "methodcaller of a lying __reduce_ex__": (
        LYING_STR + "import operator\noperator.methodcaller(S(d + 'reduce_ex' + d), 2)(1)",
        "validation",
    ),
    "global_enum with a lying module": (
        LYING_STR + "import enum\nE = enum.Enum('E', 'USER_MODULE', module=S('worker.guards'))\n"
        "enum.global_enum(E)",
        "validation",
    ),
    "global_enum of an enum claiming a library module": (
        "import enum\nE = enum.Enum('E', 'dumps', module='json')\nenum.global_enum(E)",
        "validation",
    ),
    "a module named by a lying str, to poison the module cache": (
        LYING_STR + "import json\ntype(json)(S('os')).anything",
        "import_blocked",
    ),
    "format template that is a lying str": (
        LYING_STR + "def f():\n    pass\nS('{0.' + d + 'globals' + d + '}').format(f)",
        "validation",
    ),
    "wraps with a lying attribute list": (
        LYING_STR + "import functools\nfunctools.wraps(len, assigned=(S(d + 'self' + d),))",
        "validation",
    ),
    "class namespace key that is a str subclass": (
        LYING_STR + "type('T', (), {S('x'): 1})",
        "validation",
    ),
    "enum member named by a lying str": (
        LYING_STR + "import enum\nenum.Enum('E', [(S(d + 'getattribute' + d), 1)])",
        "validation",
    ),
    # string evaluation in a module's namespace
    "ForwardRef evaluated in module os": (
        "import typing\nref = typing.ForwardRef('system', module='os')\ndef f(x: ref):\n"
        "    pass\ntyping.get_type_hints(f)",
        "import_blocked",
    ),
    "ForwardRef module given as a lying str": (
        LYING_STR + "import typing\nref = typing.ForwardRef('system', module=S('os'))\n"
        "def f(x: ref):\n    pass\ntyping.get_type_hints(f)",
        "import_blocked",
    ),
    "string annotation walking to sys through an allowed module": (
        "import typing\ndef f(x: 'typing.sys.modules'):\n    pass\ntyping.get_type_hints(f)",
        "import_blocked",
    ),
    "string annotation read in a library function's globals through __wrapped__": (
        "import functools, json, typing\ndef w(x: 'decoder.JSONDecoder'):\n    pass\n"
        "typing.get_type_hints(functools.wraps(json.dumps, assigned=('__module__',))(w))",
        "import_blocked",
    ),
    "string annotation of a class claiming module os": (
        DUNDER + "import typing\n"
        "T = type('T', (), {d + 'module' + d: 'os', d + 'annotations' + d: {'a': 'system'}})\n"
        "typing.get_type_hints(T)",
        "validation",
    ),
    "string annotation that calls": (
        "import typing\ndef f(x: 'print(1)'):\n    pass\ntyping.get_type_hints(f)",
        "validation",
    ),
    # protocol attributes read twice, attributes read without a hook
    "__match_args__ property on a metaclass": (
        DUNDER + "import abc, json\ncalls = []\ndef answer(cls):\n    calls.append(1)\n"
        "    return ('real',) if len(calls) == 1 else (d + 'globals' + d,)\n"
        "M = type('M', (abc.ABCMeta,), {d + 'match_args' + d: property(answer)})\n"
        "C = M('C', (), {})\nC.register(type(json.dumps))\n"
        "match json.dumps:\n    case C(g):\n        pass",
        "validation",
    ),
    "__match_args__ that is a property on the class": (
        DUNDER + "import abc, json\n"
        "C = abc.ABCMeta('C', (), {d + 'match_args' + d: property(lambda s: ('real',))})\n"
        "C.register(type(json.dumps))\nmatch json.dumps:\n    case C(g):\n        pass",
        "validation",
    ),
    "keyword class pattern reading a module's attribute": (
        "import typing\nmatch typing:\n    case object(sys=s):\n        pass",
        "validation",
    ),
    "class pattern on a module nested in a list": (
        "import typing\nmatch [typing]:\n    case [object(sys=s)]:\n        pass",
        "validation",
    ),
    "positional pattern on a registered module type": (
        "import abc, dataclasses, typing\n@dataclasses.dataclass\nclass C(abc.ABC):\n"
        "    sys: int\nC.register(type(typing))\nmatch typing:\n    case C(s):\n        pass",
        "validation",
    ),
    # the class-body rule for classes made at run time
    "type() defining __getattribute__": (
        DUNDER + "type('T', (), {d + 'getattribute' + d: lambda self, name: 1})",
        "validation",
    ),
    "type() defining __init_subclass__": (
        DUNDER + "type('T', (), {d + 'init_subclass' + d: classmethod(lambda cls: None)})",
        "validation",
    ),
    "type() defining __reduce_ex__": (
        DUNDER + "type('T', (), {d + 'reduce_ex' + d: lambda self, p: (print, ())})",
        "validation",
    ),
    "type() defining __class_getitem__": (
        DUNDER + "type('T', (), {d + 'class_getitem' + d: lambda cls, item: item})",
        "validation",
    ),
    "type() defining __set_name__": (
        DUNDER + "type('T', (), {d + 'set_name' + d: lambda self, owner, name: None})",
        "validation",
    ),
    "type() defining __instancecheck__ on a metaclass": (
        DUNDER + "type('M', (type,), {d + 'instancecheck' + d: lambda cls, obj: True})",
        "validation",
    ),
    "type() defining __class__": (
        DUNDER + "type('T', (), {d + 'class' + d: property(lambda self: int)})",
        "validation",
    ),
    "type() binding a definable dunder to a builtin": (
        DUNDER + "type('T', (), {d + 'call' + d: type})",
        "validation",
    ),
    "type() given a forged __classcell__": (
        DUNDER + "type('T', (), {d + 'classcell' + d: 1})",
        "validation",
    ),
    "type() with unpacked arguments": (
        DUNDER + "args = ('T', (), {d + 'getattribute' + d: len})\ntype(*args)",
        "validation",
    ),
    "abc.ABCMeta called as type()": (
        DUNDER + "import abc\nabc.ABCMeta('T', (), {d + 'getattribute' + d: len})",
        "validation",
    ),
    "the metaclass of an ABC called": (
        DUNDER + "import abc\ntype(abc.ABC)('T', (), {d + 'reduce_ex' + d: len})",
        "validation",
    ),
    "type.__new__ through super() in a metaclass": (
        DUNDER + "class M(type):\n    def __new__(mcls, name, bases, ns):\n"
        "        ns[d + 'getattribute' + d] = lambda self, n: 1\n"
        "        return super().__new__(mcls, name, bases, ns)\n"
        "class T(metaclass=M):\n    pass",
        "validation",
    ),
    "type handed to map": (
        DUNDER + "list(map(type, ['T'], [()], [{d + 'getattribute' + d: len}]))",
        "validation",
    ),
    "type inside a partial": (
        DUNDER + "import functools\nmake = functools.partial(type, 'T', ())\n"
        "make({d + 'getattribute' + d: len}, *())",
        "validation",
    ),
    "type handed to itertools.starmap": (
        DUNDER + "import itertools\n"
        "list(itertools.starmap(type, [('T', (), {d + 'getattribute' + d: len})]))",
        "validation",
    ),
    "type in a partial split over two calls": (
        DUNDER
        + "import functools\nfunctools.partial(type, 'T')((), {d + 'getattribute' + d: len})",
        "validation",
    ),
    "type in partials nested one argument at a time": (
        DUNDER + "import functools\np = functools.partial(type)\nq = functools.partial(p, 'T')",
        "validation",
    ),
    "type in a partial made by the class of a library-made partial": (
        DUNDER
        + "Partial = type('{}'.format)\nPartial(type, 'T')((), {d + 'getattribute' + d: len})",
        "validation",
    ),
    "type bound as a method by the class of a bound method": (
        DUNDER + "class K:\n    def m(self):\n        pass\nMethod = type(K().m)\n"
        "Method(type, 'T')((), {d + 'getattribute' + d: len})",
        "validation",
    ),
    "type in a staticmethod object": (
        DUNDER + "staticmethod(type)('T', (), {d + 'getattribute' + d: len})",
        "validation",
    ),
    "type behind lru_cache": (
        DUNDER
        + "import functools\nfunctools.lru_cache()(type)('T', (), {d + 'getattribute' + d: len})",
        "validation",
    ),
    "type registered with singledispatch": (
        DUNDER + "import functools\n@functools.singledispatch\ndef g(x):\n    pass\n"
        "g.register(str)(type)",
        "validation",
    ),
    "type.__call__ of a metaclass's metaclass through super()": (
        DUNDER + "class MM(type):\n    def __call__(cls, *args):\n"
        "        return super().__call__('T', (), {d + 'getattribute' + d: len})\n"
        "class M(type, metaclass=MM):\n    pass\nM('X', (), {})",
        "validation",
    ),
    "type reached through the alias type[int]": (
        DUNDER + "type[int]('T', (), {d + 'getattribute' + d: len})",
        "validation",
    ),
    "type reached through typing.Annotated": (
        DUNDER
        + "import typing\ntyping.Annotated[type, 'x']('T', (), {d + 'getattribute' + d: len})",
        "validation",
    ),
    "type as the data type of an enum, members made from the class body": (
        DUNDER + "import enum\nclass E(type, enum.Enum):\n"
        "    A = ('T', (), {d + 'getattribute' + d: len})",
        "validation",
    ),
    "functools.partial as the data type of an enum": (
        DUNDER + "import enum, functools\nclass E(functools.partial, enum.Enum):\n"
        "    A = (type, 'T', (), {d + 'getattribute' + d: len})",
        "validation",
    ),
    "collections.UserString.format reaching __globals__": (
        "import collections\ndef f():\n    pass\n"
        "collections.UserString('{0.__globals__}').format(f)",
        "validation",
    ),
    "collections.UserString.format_map reaching __globals__": (
        "import collections\ndef f():\n    pass\n"
        "collections.UserString('{x.__globals__}').format_map({'x': f})",
        "validation",
    ),
    "type handed to operator.call": (
        DUNDER + "import operator\noperator.call(type, 'T', (), {d + 'getattribute' + d: len})",
        "validation",
    ),
    "make_dataclass namespace (types.new_class)": (
        DUNDER + "import dataclasses\n"
        "dataclasses.make_dataclass('C', [], namespace={d + 'reduce_ex' + d: len})",
        "validation",
    ),
    "enum's functional API with a dunder member": (
        DUNDER + "import enum\nenum.Enum('E', [('A', 1), (d + 'reduce_ex' + d, len)])",
        "validation",
    ),
    "enum's functional API with a dunder key in a mapping": (
        DUNDER + "import enum\nenum.Enum('E', {'A': 1, d + 'getattribute' + d: 5})",
        "validation",
    ),
    # copy: a reduce result from the public dispatch table
    "copy setting a module attribute": (
        "import copy, typing\nclass B:\n    pass\n"
        "copy.dispatch_table[B] = lambda o: ((lambda: typing), (), (None, {'sys': 1}))\n"
        "copy.copy(B())",
        "validation",
    ),
    "copy setting __class__": (
        DUNDER + "import copy\nclass B:\n    pass\nclass C:\n    pass\n"
        "copy.dispatch_table[B] = lambda o: (C, (), (None, {d + 'class' + d: B}))\n"
        "copy.copy(B())",
        "validation",
    ),
    "copy calling type": (
        DUNDER + "import copy\nclass B:\n    pass\n"
        "copy.dispatch_table[B] = lambda o: (type, ('T', (), {d + 'getattribute' + d: len}))\n"
        "copy.copy(B())",
        "validation",
    ),
    # writes library code trusts
    "update_wrapper copying a module's globals": (
        "import functools, typing\nclass O:\n    pass\nfunctools.update_wrapper(O(), typing)",
        "validation",
    ),
    "update_wrapper writing a library function": (
        "import functools, json\ndef f(x: 'int'):\n    pass\n"
        "functools.update_wrapper(json.dumps, f)",
        "validation",
    ),
    "renaming a dataclass field": (
        "import dataclasses\n@dataclasses.dataclass\nclass A:\n    x: int\n"
        "dataclasses.fields(A)[0].name = 'x=1'",
        "validation",
    ),
    "a dataclass made of a library class": (
        "import dataclasses, json\ndataclasses.dataclass(json.JSONEncoder)",
        "validation",
    ),
    "a dataclass field name that is a str subclass": (
        LYING_STR + "import dataclasses\ndataclasses.make_dataclass('C', [S('x')])",
        "validation",
    ),
}


@pytest.mark.parametrize(("code", "error_type"), ESCAPES.values(), ids=ESCAPES.keys())
def test_each_escape_family_is_refused_at_its_root(
    executor: Executor, code: str, error_type: str
) -> None:
    refused(executor, code, error_type)


# --- classes made past the class-body rule: of no use ----------------------------------


MADE_PAST_THE_RULE = {
    "its __reduce_ex__ asks copy to set a module attribute": (
        "import copy, typing\n"
        "T = made('T', {d + 'reduce_ex' + d: lambda s, p: ((lambda: typing), (), {'sys': 1})})\n"
        "copy.copy(T())",
        "validation",
    ),
    "its __class__ poses as dataclasses.Field": (
        "import dataclasses\n"
        "F = made('F', {d + 'class' + d: property(lambda s: dataclasses.Field)})\n"
        "@dataclasses.dataclass\nclass A:\n    x: int = F()",
        "AttributeError",
    ),
    "a metaclass's __prepare__ replaces the guards in a class body": (
        "import typing\ndef fake(obj, name):\n    return 'unguarded'\n"
        "M = made('M', {d + 'prepare' + d: classmethod(lambda *a, **k: "
        "{'_' * 2 + 'sandhold_attr' + '_' * 2: fake})}, (type,))\n"
        "class X(metaclass=M):\n    v = typing.sys",
        "import_blocked",
    ),
    "its __match_args__ is a property": (
        "import abc, json\n"
        "C = made('C', {d + 'match_args' + d: property(lambda s: (d + 'globals' + d,))},"
        " (abc.ABC,))\n"
        "C.register(type(json.dumps))\nmatch json.dumps:\n    case C(g):\n        pass",
        "validation",
    ),
    "its metaclass answers every instance check": (
        "import typing\nM = made('M', {d + 'instancecheck' + d: lambda c, o: True}, (type,))\n"
        "C = M('C', (), {})\nmatch typing:\n    case C(sys=s):\n        pass",
        "validation",
    ),
    "it claims module os for its string annotations": (
        "import typing\n"
        "T = made('T', {d + 'module' + d: 'os', d + 'annotations' + d: {'a': 'system'}})\n"
        "typing.get_type_hints(T)",
        "import_blocked",
    ),
    "its metaclass answers global_enum another __module__": (
        "import enum\n"
        "M = made('M', {d + 'module' + d: property(lambda c: 'json')}, (enum.EnumType,))\n"
        "class E(enum.Enum, metaclass=M):\n    dumps = 1\nenum.global_enum(E)",
        "validation",
    ),
    "its metaclass is not a standard one, for a dataclass": (
        "import dataclasses\nM = made('M', {}, (type,))\nclass C(metaclass=M):\n    x: int\n"
        "dataclasses.dataclass(C)",
        "validation",
    ),
    "it poses as ForwardRef to receive the namespace": (
        "import typing\n"
        "F = made('F', {d + 'class' + d: property(lambda s: typing.ForwardRef), "
        "'_evaluate': lambda s, g, l, r: l})\n"
        "T = made('T', {d + 'module' + d: 'os', d + 'annotations' + d: {'a': F()}})\n"
        "typing.get_type_hints(T)['a'].lookup('system')",
        "import_blocked",
    ),
}


@pytest.mark.parametrize(
    ("code", "error_type"), MADE_PAST_THE_RULE.values(), ids=MADE_PAST_THE_RULE.keys()
)
def test_a_class_made_past_the_class_body_rule_gets_nowhere(
    executor: Executor, code: str, error_type: str
) -> None:
    executor.namespace["made"] = made
    refused(executor, DUNDER + code, error_type)


def test_a_poisoned_module_cache_cannot_open_a_later_import(executor: Executor) -> None:
    poison = LYING_STR + (
        "import json\n"
        "for name in ('os', 'sys'):\n"
        "    try:\n"
        "        type(json)(S(name)).x\n"
        "    except ImportError:\n"
        "        pass"
    )
    assert executor.execute(poison).success
    refused(executor, "import os", "import_blocked")
    refused(executor, "import typing\ntyping.sys.modules", "import_blocked")


def test_the_module_policy_judges_and_caches_only_plain_names() -> None:
    class Lying(str):
        def split(self, *args: object, **kwargs: object) -> list[str]:
            return ["json"]

        def __eq__(self, other: object) -> bool:
            return True

        def __hash__(self) -> int:
            return hash("os")

    policy = ModulePolicy(frozenset({"json"}), frozenset({"os"}))
    assert policy.refusal(Lying("os")) == "module 'os' is forbidden by the policy"
    assert policy.refusal("os") == "module 'os' is forbidden by the policy"
    assert all(type(key) is str for key in policy._answers)


def test_a_user_refusal_class_cannot_pick_the_reported_error_type(executor: Executor) -> None:
    code = (
        "import json\n"
        "try:\n"
        "    json.decoder\n"
        "except ImportError as e:\n"
        "    Blocked = type(e)\n"
        "class Fake(Blocked):\n"
        "    error_type = 'timeout'\n"
        "raise Fake('forged')"
    )
    outcome = executor.execute(code)
    assert outcome.error_type == "Fake"


def test_types_new_class_keeps_the_class_body_rule() -> None:
    allowed = default_config().allowed_modules | {"types"}
    with restricted_executor(allowed_modules=allowed) as executor:
        refused(
            executor,
            DUNDER + "import types\n"
            "types.new_class('T', (), {}, lambda ns: ns.update({d + 'getattribute' + d: len}))",
            "validation",
        )
        outcome = executor.execute(
            "import types\n"
            "def body(ns):\n"
            "    ns['x'] = 1\n"
            "    ns['_' * 2 + 'init' + '_' * 2] = lambda self: None\n"
            "T = types.new_class('T', (), {}, body)\n"
            "(T.x, T.__module__, type(T()).__name__)"
        )
        assert outcome.result_repr == "(1, '__main__', 'T')", outcome


# --- ordinary code of the same families -------------------------------------------------


ORDINARY = {
    "type() with plain attributes and cell methods": (
        "def init(self, v):\n    self.v = v\n"
        "T = type('T', (), {'x': 1, '_y': 2, '_' * 2 + 'init' + '_' * 2: init, "
        "'_' * 2 + 'slots' + '_' * 2: ('v',)})\n"
        "(T.x, T._y, T(3).v, T.__module__)",
        "(1, 2, 3, '__main__')",
    ),
    "a metaclass using super().__new__": (
        "class M(type):\n    def __new__(mcls, name, bases, ns):\n"
        "        ns['tag'] = name.lower()\n        return super().__new__(mcls, name, bases, ns)\n"
        "class A(metaclass=M):\n    pass\nA.tag",
        "'a'",
    ),
    "a metaclass handing on a class statement's namespace (with __classcell__)": (
        "class M(type):\n    def __new__(mcls, name, bases, ns):\n"
        "        return super().__new__(mcls, name, bases, ns)\n"
        "class Base:\n    def hello(self):\n        return 'base'\n"
        "class A(Base, metaclass=M):\n    def hello(self):\n        return super().hello() + '!'\n"
        "A().hello()",
        "'base!'",
    ),
    "calls with three or more arguments": (
        "class B:\n    def __init__(self, a, b, c):\n        self.s = a + b + c\n"
        "class C(B):\n    def __init__(self):\n        super().__init__(1, 2, 3)\n"
        "def f(*a, **k):\n    return a, k\n"
        "(C().s, list(range(0, 9, 4)), f(*[1, 2], **{'x': 3}), max(3, 1, 2), print(1, 2, 3))",
        "(6, [0, 4, 8], ((1, 2), {'x': 3}), 3, None)",
    ),
    "enums: classes, functional API, global_enum": (
        "import enum\nclass Color(enum.Enum):\n    RED = 1\n"
        "E = enum.Enum('E', 'A B')\nF = enum.IntEnum('F', [('X', 1)])\n"
        "G = enum.Enum('G', {'P': 'p'})\n"
        "enum.global_enum(Color)\n(RED, E.B.value, F.X + 1, G.P.value, E.__module__)",
        "(__main__.RED, 2, 2, 'p', '__main__')",
    ),
    "named tuples and string annotations": (
        "import collections, typing\nP = collections.namedtuple('P', 'x y', defaults=[0])\n"
        "class N(typing.NamedTuple):\n    a: int\n    b: 'str' = 'z'\n"
        "(P(1), N(1), typing.get_type_hints(N))",
        "(P(x=1, y=0), N(a=1, b='z'), {'a': <class 'int'>, 'b': <class 'str'>})",
    ),
    "dataclasses, make_dataclass, replace": (
        "import dataclasses\n@dataclasses.dataclass(order=True)\nclass P:\n    x: int\n"
        "    y: 'int' = 0\n"
        "    tags: list = dataclasses.field(default_factory=list, compare=False)\n"
        "@dataclasses.dataclass(slots=True)\nclass Q(P):\n    w: int = 1\n"
        "D = dataclasses.make_dataclass('D', [('a', int)],"
        " namespace={'twice': lambda s: s.a * 2})\n"
        "(P(1) < P(2), Q(1, 2, [], 4), D(2).twice(), dataclasses.replace(P(1), y=5))",
        "(True, Q(x=1, y=2, tags=[], w=4), 4, P(x=1, y=5, tags=[]))",
    ),
    "match on ordinary classes": (
        "import dataclasses\n@dataclasses.dataclass\nclass Pt:\n    x: int\n    y: int\n"
        "class Box:\n    __match_args__ = ('w',)\n    def __init__(self):\n        self.w = 3\n"
        "def f(v):\n    match v:\n        case Pt(0, y):\n            return ('y', y)\n"
        "        case Pt(x=x, y=0):\n            return ('x', x)\n"
        "        case Box(w):\n            return ('box', w)\n"
        "        case int(n) if n > 5:\n            return ('big', n)\n"
        "        case [Pt(a, b), *rest]:\n            return ('list', a, b, rest)\n"
        "        case {'k': Pt(x=k)}:\n            return ('map', k)\n"
        "        case float(real=r):\n            return ('float', r)\n"
        "[f(Pt(0, 4)), f(Pt(3, 0)), f(Box()), f(9), f([Pt(1, 2), 5]), f({'k': Pt(7, 7)}), f(2.5)]",
        "[('y', 4), ('x', 3), ('box', 3), ('big', 9), ('list', 1, 2, [5]), ('map', 7), "
        "('float', 2.5)]",
    ),
    "match inside a class body": (
        "import dataclasses\n@dataclasses.dataclass\nclass Pt:\n    x: int\n"
        "class K:\n    '''doc'''\n    match Pt(4):\n        case Pt(x):\n            seen = x\n"
        "(K.seen, K.__doc__)",
        "(4, 'doc')",
    ),
    "typing: forward references, ForwardRef, singledispatch": (
        "import typing, functools\nclass Node:\n    next: 'typing.Optional[Node]'\n"
        "def f(a: 'Node', b: 'dict[str, typing.List[\"Node\"]]', c: typing.ForwardRef('int')):\n"
        "    pass\n"
        "@functools.singledispatch\ndef show(x):\n    return 'any'\n"
        "@show.register\ndef _(x: 'int'):\n    return 'int'\n"
        "(typing.get_type_hints(Node), typing.get_type_hints(f), show(1), show('a'))",
        "({'next': typing.Optional[__main__.Node]}, {'a': <class '__main__.Node'>, "
        "'b': dict[str, typing.List[__main__.Node]], 'c': <class 'int'>}, 'int', 'any')",
    ),
    "copy of objects with private attributes and slots": (
        "import copy, dataclasses\nclass K:\n    def __init__(self):\n        self.__p = [1]\n"
        "    def p(self):\n        return self.__p\n"
        "class S:\n    __slots__ = ('a', '_b')\n    def __init__(self):\n"
        "        self.a = 1\n        self._b = 2\n"
        "@dataclasses.dataclass\nclass DC:\n    v: list\n"
        "(copy.deepcopy(K()).p(), copy.copy(S())._b, copy.deepcopy(DC([1])))",
        "([1], 2, DC(v=[1]))",
    ),
    "aliases, UserString and enums with data types": (
        "import collections, enum, typing\n"
        "class Code(str, enum.Enum):\n    OK = 'ok'\n"
        "(list[int]((1, 2)), typing.DefaultDict[str, int](int, a=1),"
        " collections.UserString('{0}-{x}').format(1, x=2), Code.OK.upper(),"
        " enum.Enum('F', [('A', 1)], type=int).A + 1)",
        "([1, 2], defaultdict(<class 'int'>, {'a': 1}), '1-2', 'OK', 2)",
    ),
    "partial, lru_cache, starmap with ordinary callables": (
        "import functools, operator, itertools\n"
        "(functools.partial(operator.add, 1)(2), functools.lru_cache()(lambda x: x * 2)(4), "
        "list(itertools.starmap(operator.mul, [(2, 3)])), list(map(pow, [2], [3], [5])))",
        "(3, 8, [6], [3])",
    ),
}


@pytest.mark.parametrize(("code", "expected"), ORDINARY.values(), ids=ORDINARY.keys())
def test_ordinary_code_of_each_family_still_runs(
    executor: Executor, code: str, expected: str
) -> None:
    outcome = executor.execute(code)
    assert outcome.success, outcome
    assert outcome.result_repr == expected


# --- the shape of the rewrite -----------------------------------------------------------


def _rewritten(code: str) -> str:
    tree = ast.parse(code)
    transform.transform(tree)
    return ast.unparse(tree)


def test_only_calls_that_could_make_a_class_are_routed_through_the_guard() -> None:
    text = _rewritten(
        "f()\nf(a)\nf(a, b)\nf(a, b, c)\nf(a, b, c, d, e)\nf(a, b, c, d, e, g)\nf(*a)\nf(**k)"
    )
    lines = text.splitlines()
    guard = transform.CALL_GUARD
    assert [guard in line for line in lines] == [False, False, True, True, True, False, True, True]


def test_every_class_body_takes_the_guards_from_the_builtins() -> None:
    text = _rewritten(
        "class A:\n    '''doc'''\n    x = o.y\n    match v:\n        case o.z:\n            pass"
    )
    body = text.splitlines()
    assert ast.literal_eval(body[1].strip()) == "doc"
    declared = body[2].strip()
    assert declared.startswith("global ")
    for name in (*transform.GUARD_NAMES, "__sandhold_match_0__"):
        assert name in declared


def test_names_are_checked_as_plain_copies_of_their_characters() -> None:
    class Lying(str):
        def __str__(self) -> str:
            return "other"

        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = str.__hash__

    plain = exact_str(Lying("__globals__"))
    assert type(plain) is str and plain == "__globals__" and plain != "other"
    with pytest.raises(TypeError):
        exact_str(b"name")


def test_a_library_making_its_own_classes_while_it_is_imported_is_left_alone(
    executor: Executor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module imported while a cell runs may decorate its own classes or call
    types.new_class: the checks are for what a cell asks for, directly or through a library
    that forwards it (singledispatch, copy)."""
    (tmp_path / "own_classes.py").write_text(
        "import dataclasses, types\n"
        "@dataclasses.dataclass\n"
        "class Record:\n"
        "    n: int\n"
        "Own = types.new_class('Own', (), {}, lambda ns: ns.update(__reduce_ex__=len))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("own_classes")
    assert module.Record(1).n == 1 and module.Own.__module__ == "types"
    monkeypatch.delitem(sys.modules, "own_classes")
    refused(
        executor,
        "import dataclasses, functools, json\n"
        "apply = functools.singledispatch(dataclasses.dataclass)\n"
        "apply(json.JSONEncoder)",
        "validation",
    )
