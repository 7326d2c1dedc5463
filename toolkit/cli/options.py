"""The options every command shares, in one place (each command's own are beside its command)."""

from __future__ import annotations

import argparse


def add_output_options(parser: argparse.ArgumentParser, verbose_help: str) -> None:
    """Every command's ``--json``, and ``-q`` / ``-v`` (one or the other): how much it prints."""
    parser.add_argument("--json", action="store_true", help="print one JSON object for machines (schema 1)")
    loudness = parser.add_mutually_exclusive_group()
    loudness.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors (the exit code says the rest)")
    loudness.add_argument("-v", "--verbose", action="store_true", help=verbose_help)
