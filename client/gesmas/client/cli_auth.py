"""The `gesmas user`, `gesmas role` and `gesmas auth` commands: their parsers and how a
command line becomes one Auth operation (the proto's AuthRequest). cli.py runs them."""
from __future__ import annotations

import argparse
import getpass
import os
import sys
from collections.abc import Callable
from typing import Any

QUOTA_FLAGS = ("sessions", "objects", "waiters", "state_bytes", "source_bytes")


def _terminal() -> bool:
    """Whether getpass can ask on a terminal (it reads /dev/tty, else a terminal stdin)."""
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return sys.stdin is not None and sys.stdin.isatty()
    os.close(fd)
    return True


def ask(prompt: str) -> str:
    """A password typed at a terminal; ValueError when there is none to type it on."""
    if not _terminal():
        raise ValueError("no terminal to type a password on")
    try:
        return getpass.getpass(prompt)
    except EOFError:
        raise ValueError("no password typed (end of input)") from None


def new_password(args: argparse.Namespace) -> str:
    """The new password: the first line of stdin (--password-stdin) or typed twice."""
    if args.password_stdin:
        line = sys.stdin.readline()
        if not line:
            raise ValueError("--password-stdin: stdin is empty (give the password as its "
                             "first line)")
        return line.rstrip("\r\n")
    try:
        first = ask(f"new password of {args.name}: ")
        again = ask("again: ")
    except ValueError as e:
        raise ValueError(f"{e}: use --password-stdin to read the new password from the "
                         "first line of stdin") from None
    if again != first:
        raise ValueError("the passwords differ")
    return first


def auth_params(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """(operation, arguments) of a `gesmas user|role|auth ...` command line; ValueError for a
    mistake in it."""
    op = args.op
    params: dict[str, Any] = {}
    for key in ("name", "role", "action", "prefix"):
        value = getattr(args, key, None)
        if value is not None:
            params[key] = value
    if op in ("role_grant", "role_revoke"):
        params["prefix"] = permission_prefix(args)
    if op in ("user_add", "user_passwd"):
        params["password"] = new_password(args)
    if op == "user_quota":
        params["quota"] = {k: (None if v < 0 else v) for k in QUOTA_FLAGS
                           if (v := getattr(args, k)) is not None}
        if not params["quota"]:
            raise ValueError("give at least one quota, e.g. --sessions 100 (-1 removes it)")
    return op, params


def permission_prefix(args: argparse.Namespace) -> str:
    """The PREFIX of `role grant|revoke NAME ACTION [PREFIX]`: a permission on every name
    must be asked for (PREFIX "" or --all-names), as etcdctl makes it explicit."""
    if args.action == "admin":
        if args.prefix or args.all_names:
            raise ValueError("admin takes no PREFIX (it is not about names)")
        return ""
    if args.all_names:
        if args.prefix:
            raise ValueError(f"give PREFIX {args.prefix!r} or --all-names, not both")
        return ""
    if args.prefix is None:
        kind = "class" if args.action == "register" else "object"
        raise ValueError(f"{args.action} on which {kind} names? give a PREFIX (e.g. "
                         f"jobs/), or --all-names (or PREFIX \"\") for every name")
    return str(args.prefix)


def add_commands(sub: Any, common: argparse.ArgumentParser, parser_class: type,
                 func: Callable[[argparse.Namespace], int]) -> None:
    """Add the user, role and auth command groups to the `gesmas` parser."""
    groups: dict[str, tuple[str, list[tuple[str, str, list[str]]]]] = {
        "user": ("manage users", [
            ("add", "add a user (password from a prompt or --password-stdin)", ["name"]),
            ("passwd", "change a user's password (users may change their own)", ["name"]),
            ("delete", "delete a user", ["name"]),
            ("grant", "give a user a role", ["name", "role"]),
            ("revoke", "take a role from a user", ["name", "role"]),
            ("get", "a user's roles and quotas", ["name"]),
            ("list", "every user", []),
            ("quota", "set a user's quotas (-1 removes one: the default applies)", ["name"]),
        ]),
        "role": ("manage roles and their permissions", [
            ("add", "add a role", ["name"]),
            ("delete", "delete a role (users lose it)", ["name"]),
            ("grant", "give a role a permission: ACTION on names starting with PREFIX",
             ["name", "action", "prefix?"]),
            ("revoke", "take a permission from a role", ["name", "action", "prefix?"]),
            ("get", "a role's permissions", ["name"]),
            ("list", "every role", []),
        ]),
        "auth": ("turn authentication on or off", [
            ("enable", "enable auth (needs the user root with the role root)", []),
            ("disable", "disable auth (root only)", []),
            ("status", "whether auth is enabled", []),
        ]),
    }
    for group, (text, ops) in groups.items():
        p = sub.add_parser(group, help=text, description=text)
        s2 = p.add_subparsers(dest=f"{group}_command", metavar="COMMAND",
                              parser_class=parser_class)
        s2.required = True
        for name, help_text, params in ops:
            a = s2.add_parser(name, parents=[common], help=help_text, description=help_text)
            for param in params:
                if param == "prefix?":
                    a.add_argument("prefix", nargs="?", default=None,
                                   help="object or class name prefix (\"\": every name); "
                                        "none for admin")
                    a.add_argument("--all-names", action="store_true",
                                   help="every object or class name (the same as PREFIX "
                                        "\"\")")
                elif param == "action":
                    a.add_argument("action", choices=["invoke", "create", "delete",
                                                      "register", "admin"])
                else:
                    a.add_argument(param, metavar=param.upper())
            if group == "user" and name in ("add", "passwd"):
                a.add_argument("--password-stdin", action="store_true",
                               help="read the new password from the first line of stdin")
            if group == "user" and name == "quota":
                for q in QUOTA_FLAGS:
                    a.add_argument(f"--{q.replace('_', '-')}", dest=q, type=int, metavar="N")
            op = f"{group}_{name}" if group != "auth" else f"auth_{name}"
            a.set_defaults(func=func, op=op)
