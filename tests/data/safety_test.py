"""Tests of the static safety filter."""

import pytest

from pau_jax.data import safety

DANGEROUS = {
    "import os": "import os\ndef f(p):\n    return os.listdir(p)\n",
    "from-import": "from subprocess import run\ndef f(c):\n    return run(c)\n",
    "dotted import": "import urllib.request\ndef f(u):\n    return urllib.request.urlopen(u)\n",
    "socket": "import socket\ndef f():\n    return socket.socket()\n",
    "shutil": "import shutil\ndef f(p):\n    shutil.rmtree(p)\n",
    "ctypes": "import ctypes\ndef f():\n    return ctypes.CDLL(None)\n",
    "multiprocessing": "import multiprocessing as mp\ndef f():\n    return mp.Pool()\n",
    "requests": "import requests\ndef f(u):\n    return requests.get(u).text\n",
    "sys": "import sys\ndef f(x):\n    sys.exit(x)\n",
    "open": "def f(p):\n    return open(p).read()\n",
    "eval": "def f(s):\n    return eval(s)\n",
    "exec": "def f(s):\n    exec(s)\n",
    "__import__": "def f(m):\n    return __import__(m)\n",
    "aliased eval": "def f(s):\n    g = eval\n    return g(s)\n",
    "dunder escape": "def f():\n    return ().__class__.__bases__[0].__subclasses__()\n",
    "getattr dunder": "def f(x):\n    return getattr(x, '__globals__')\n",
    "nested import": "def f(p):\n    import os\n    return os.remove(p)\n",
}

BENIGN = {
    "arithmetic": "def f(a, b):\n    return a * b + 1\n",
    "math and collections": (
        "import math\nfrom collections import Counter\n"
        "def f(xs):\n    return math.prod(Counter(xs).values())\n"
    ),
    "parameter named input": "def f(input):\n    return input[::-1]\n",
    "variable named open": "def f(doors):\n    open = [d for d in doors if d]\n    return len(open)\n",
    "string mentioning os": "def f(s):\n    return s.replace('import os', '')\n",
    "method named exec": "def f(x):\n    return x.strip().split()\n",
}


@pytest.mark.parametrize("name", sorted(DANGEROUS))
def test_dangerous_code_is_caught(name):
    assert not safety.is_safe(DANGEROUS[name])
    assert safety.unsafe_reasons(DANGEROUS[name])


@pytest.mark.parametrize("name", sorted(BENIGN))
def test_benign_code_passes(name):
    assert safety.unsafe_reasons(BENIGN[name]) == ()


def test_reasons_name_the_offence():
    reasons = safety.unsafe_reasons("import os, json\ndef f():\n    return eval('1')\n")
    assert reasons == ("call eval", "import os")
    assert safety.unsafe_reasons("def f(:\n") == ("syntax error",)
