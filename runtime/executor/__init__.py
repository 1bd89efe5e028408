"""EXECUTE: running a frozen Plan."""

from .run import ArenaState, Executor  # noqa: F401
