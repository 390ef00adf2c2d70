"""The docstring examples of every circbuf module run as tests (what
``pytest --doctest-modules circbuf`` runs), so ``python -m pytest -q tests``
and CI collect them."""

import doctest
import importlib
import io
import pkgutil

import pytest

import circbuf

MODULES = ["circbuf", *sorted(m.name for m in pkgutil.walk_packages(circbuf.__path__, prefix="circbuf."))]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    out = io.StringIO()
    runner = doctest.DocTestRunner()
    for test in doctest.DocTestFinder().find(module, name):
        runner.run(test, out=out.write)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, out.getvalue()


def test_examples_are_found():
    """The finder sees the examples (a collection that finds none checks nothing)."""
    n = 0
    for name in MODULES:
        n += sum(len(t.examples) for t in doctest.DocTestFinder().find(importlib.import_module(name), name))
    assert n >= 20, n
