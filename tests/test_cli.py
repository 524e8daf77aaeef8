"""The ``flurka`` console script's own surface: its version, and help for every sweep flag."""

from __future__ import annotations

import argparse
import importlib.metadata

from testsupport import flurka


def test_version_is_the_installed_package(tmp_path):
    code, out, _ = flurka(["--version"], tmp_path)
    assert (code, out.strip()) == (0, f"flurka {importlib.metadata.version('flurka')}")


def test_every_sweep_flag_says_what_it_does():
    """A flag without help is a flag a user has to read the source for (issue 59)."""
    from flurka.sweeps.spec import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    bare = [a.option_strings[0] for a in parser._actions if a.option_strings and not a.help]
    assert not bare, f"sweep flags without help: {bare}"
