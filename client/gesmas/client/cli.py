"""The ``gesmas`` command: call methods, upload classes, inspect and run a cluster.

Client commands (call, upload, status, objects, classes, admin; lock, elect, delete in
cli_hold.py; map in cli_map.py) talk to ``--cluster``;
``health`` asks one replica. Server
commands (up, server) only parse their arguments here and hand the Namespace to
``gesmas.server.node``, imported when they run. Errors are one line on stderr:
exit 2 for usage mistakes, 1 for errors from (or reaching) the cluster.
"""
from __future__ import annotations

import argparse
import base64
import binascii
import importlib
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from gesmas.client import cli_auth, cli_hold, cli_map
from gesmas.client.client import DEFAULT_CLUSTER, Client
from gesmas.client.errors import GesmasError, NotFound
from gesmas.client.security import TLS

__all__ = ["main"]

BYTES_KEY = "$bytes"

VALUES_HELP = f"""\
values: each ARG is parsed as JSON (42, 1.5, true, null, "text", [1, 2], {{"k": "v"}});
  a word that is not valid JSON is taken as a string (so  produce hello  sends "hello",
  but  produce 42  sends the number: write '"42"' for the string). An ARG that starts
  with {{ [ or " must be valid JSON. Bytes are written {{"{BYTES_KEY}": "<base64>"}} both
  in arguments and in printed results.
"""


class UsageError(Exception):
    """A mistake in the command line, reported with exit status 2."""


# --- JSON <-> plain values ---------------------------------------------------------------


def _decode(x: Any) -> Any:
    """JSON-decoded data -> plain values: {"$bytes": b64} becomes bytes."""
    if isinstance(x, dict):
        if len(x) == 1 and BYTES_KEY in x and isinstance(x[BYTES_KEY], str):
            try:
                return base64.b64decode(x[BYTES_KEY], validate=True)
            except binascii.Error as e:
                raise UsageError(f"{BYTES_KEY}: not valid base64: {e}") from None
        return {k: _decode(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_decode(v) for v in x]
    return x


def _encode(x: Any) -> Any:
    """Plain values -> JSON-encodable data: bytes become {"$bytes": b64}."""
    if isinstance(x, bytes):
        return {BYTES_KEY: base64.b64encode(x).decode("ascii")}
    if isinstance(x, dict):
        return {k: _encode(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_encode(v) for v in x]
    return x


def parse_arg(text: str) -> Any:
    """One command-line value: JSON, or else the text itself as a string. Text that starts
    as JSON does ({, [ or ") must be JSON: '{"a": 1,}' is a mistake, not a string."""
    try:
        data = json.loads(text)
    except ValueError as e:
        if text.lstrip()[:1] in ('{', '[', '"'):
            raise UsageError(f"argument {text!r} is not valid JSON: {e} (a string that "
                             f"starts with {text.lstrip()[0]} is written as JSON: "
                             f"{json.dumps(text)})") from None
        return text
    return _decode(data)


def seconds(text: str) -> float:
    """A number of seconds on the command line: >= 0, `inf` allowed, not NaN."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if math.isnan(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, not {text!r}")
    return value


def _count(text: str) -> int:
    """A number of objects on the command line: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {text!r}")
    return value


def _parse_json(text: str, what: str, types: tuple[type, ...]) -> Any:
    try:
        data = _decode(json.loads(text))
    except ValueError as e:
        raise UsageError(f"{what}: not valid JSON: {e}") from None
    if not isinstance(data, types):
        kinds = " or ".join("a JSON list" if t is list else "a JSON object" for t in types)
        raise UsageError(f"{what}: expected {kinds}, got {text!r}")
    return data


def _dump(x: Any) -> str:
    return json.dumps(_encode(x), ensure_ascii=False)


# --- client commands ---------------------------------------------------------------------


def _client(args: argparse.Namespace, session: bool = False, **options: Any) -> Client:
    tls: Any = None
    if args.tls_ca or args.tls_cert or args.tls_key:
        tls = TLS(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key)
    user = args.user or os.environ.get("GESMAS_USER") or None
    password = None
    if user is not None:
        password = os.environ.get("GESMAS_PASSWORD")
        if password is None:
            try:
                password = cli_auth.ask(f"password of {user}: ")
            except ValueError as e:
                raise UsageError(f"{e}: set GESMAS_PASSWORD to log in as {user}") from None
    if args.consistency not in (None, "linearizable", "sequential"):   # from the environment
        raise UsageError(f"GESMAS_CONSISTENCY: must be linearizable or sequential, not "
                         f"{args.consistency!r}")
    try:
        return Client(args.cluster, retry_timeout=args.retry_timeout, connect=session, tls=tls,
                      user=user, password=password,
                      consistency=args.consistency or "linearizable", **options)
    except ValueError as e:  # a malformed --cluster
        raise UsageError(f"--cluster: {e}") from None


def cmd_call(args: argparse.Namespace) -> int:
    positional = [parse_arg(a) for a in args.args]
    kwargs = _parse_json(args.kwargs, "--kwargs", (dict,)) if args.kwargs else {}
    if "timeout" in kwargs:
        raise UsageError(f"--kwargs: \"timeout\" bounds the call's wait and is not passed "
                         f"to methods: write --timeout {_dump(kwargs['timeout'])}")
    ctor = None
    if args.create is not None:
        ctor = _parse_json(args.create, "--create", (list, dict))
    with _client(args, session=True) as c:
        if ctor is None:
            try:
                result = c.invoke(args.cls, args.object, args.method, *positional,
                                  timeout=args.timeout, **kwargs)
            except NotFound as e:
                if not e.message.startswith("no object named"):
                    raise
                raise NotFound(f"{e.message} (to make it first: --create, or --create "
                               f"'[ARGS]' with constructor arguments)", e.type) from None
        else:
            ctor_args, ctor_kwargs = (ctor, {}) if isinstance(ctor, list) else ([], ctor)
            proxy = c.object(args.cls, args.object, *ctor_args, **ctor_kwargs)
            result = proxy.invoke(args.method, *positional, timeout=args.timeout, **kwargs)
    print(_dump(result))
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    try:
        with open(args.file, encoding="utf-8") as f:
            source = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read {args.file}: {e}") from None
    with _client(args) as c:
        print(_dump(c.register_class(source)))
    return 0


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows
    )


def cmd_status(args: argparse.Namespace) -> int:
    with _client(args) as c:
        # sequential unless asked: it answers without a leader too
        st = c.status(consistency=args.consistency or "sequential")
        digest = c.state_digest() if args.digest else None
    if args.json:
        print(json.dumps(st if digest is None else dict(st, state_digest=digest), indent=2))
        return 0
    if digest is not None:
        print(f"digest     {digest}")
    print(f"leader     {st['leader_address'] or '(none known)'}   term {st['term']}")
    print(f"commit     {st['commit_index']}   "
          f"(applied {st['last_applied']} on {st['address']})")
    print(f"objects    {st['object_count']}   waiters {st['waiter_count']}   "
          f"sessions {st['session_count']}")
    if st.get("rejoining"):
        print(f"REJOINING  {st['address']} started with an empty data dir and has not caught "
              "up: it gives no votes yet")
    if st["nodes"]:
        rows = [["NODE", "ADDRESS", "ROLE", "CONNECTED", "MATCH INDEX"]]
        for n in st["nodes"]:
            leads = n["address"] and n["address"] == st["leader_address"]
            rows.append([n["node_id"], n["address"], "leader" if leads else "follower",
                         "yes" if n["connected"] else "NO", str(n["match_index"])])
        print()
        print(_table(rows))
    return 0


def _host(address: str) -> str:
    host = address.rpartition(":")[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def cmd_health(args: argparse.Namespace) -> int:
    """One gRPC health check of ONE replica, without a login (what a container probe runs:
    the kubelet's own gRPC probe cannot speak TLS). 0 if it is SERVING (with --live: if it
    answers at all, SERVING or not), else 1 with the reason on stderr."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from gesmas.client.client import check_address
    own = os.environ.get("GESMAS_CLIENT_ADDR") or ""
    address = (args.address or os.environ.get("GESMAS_HEALTH_ADDR") or own
               or args.cluster.split(",")[0].strip())
    try:
        check_address(address)
    except ValueError as e:
        raise UsageError(str(e)) from None
    # the replica's certificate is for the host of its client address, which may not be the
    # address dialled (GESMAS_HEALTH_ADDR: the pod's IP, so that no DNS lookup is needed)
    name = args.tls_server_name or (_host(own) if own else "") or _host(address)
    if args.tls_ca or args.tls_cert or args.tls_key:
        creds = TLS(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key).credentials()
        options = [("grpc.ssl_target_name_override", name)] if name != _host(address) else []
        channel = grpc.secure_channel(address, creds, options=options)
    else:
        channel = grpc.insecure_channel(address)
    statuses = health_pb2.HealthCheckResponse.ServingStatus
    with channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service),
                timeout=None if math.isinf(args.timeout) else args.timeout)
        except grpc.RpcError as e:
            print(f"gesmas health: {address}: no answer ({e.code().name}: {e.details()})",
                  file=sys.stderr)
            return 1
    status = statuses.Name(answer.status)
    print(f"{address}: {status}")
    if args.live or answer.status == statuses.SERVING:
        return 0
    print(f"gesmas health: {address} is {status}: it does not reach a leader or lags "
          "behind (README \"Probes\")", file=sys.stderr)
    return 1


def cmd_objects(args: argparse.Namespace) -> int:
    with _client(args) as c:
        objects = c.list_objects(prefix=args.prefix, class_name=args.class_name,
                                 limit=args.limit)
    if args.json:
        print(json.dumps(objects, indent=2))
    elif objects:
        rows = [["NAME", "CLASS", "VERSION", "WAITERS"]]
        rows += [[o["name"], o["class_name"], str(o["class_version"]), str(o["waiters"])]
                 for o in objects]
        print(_table(rows))
    return 0


def cmd_classes(args: argparse.Namespace) -> int:
    with _client(args) as c:
        classes = c.list_classes()
    if args.json:
        print(json.dumps(classes, indent=2))
    elif classes:
        print(_table([["CLASS", "VERSION"]] + [[k, str(v)] for k, v in classes.items()]))
    return 0


def cmd_add_node(args: argparse.Namespace) -> int:
    with _client(args) as c:
        changed = c.add_node(args.raft_addr, args.client_addr or "")
    if changed:
        print(f"added {args.raft_addr}; now start it with --peers listing every member")
    else:
        print(f"{args.raft_addr} already is a member; nothing changed")
    return 0


def cmd_remove_node(args: argparse.Namespace) -> int:
    with _client(args) as c:
        changed = c.remove_node(args.raft_addr)
    if changed:
        print(f"removed {args.raft_addr}")
    else:
        print(f"{args.raft_addr} is not a member; nothing changed")
    return 0


def cmd_map(args: argparse.Namespace) -> int:
    with _client(args, session=True) as c:
        try:
            return cli_map.run(c.map(args.name), args, parse_arg, _parse_json, _dump)
        except ValueError as e:           # a mistake in the command line
            raise UsageError(str(e)) from None


def cmd_backup(args: argparse.Namespace) -> int:
    """Take a backup, write it to FILE atomically, read it back and check it."""
    from gesmas.protocol import backups
    folder = os.path.dirname(os.path.abspath(args.file))
    if not os.path.isdir(folder) or os.path.isdir(args.file):
        raise UsageError(f"{args.file}: not a file in an existing directory")
    with _client(args) as c:
        head, blob = c.backup(timeout=args.timeout)
    try:
        backups.write(args.file, head, blob)
        backups.read(args.file)
    except backups.BadBackup as e:
        raise GesmasError(f"{args.file}: written, but reading it back failed: {e}") from None
    print(f"backup of log index {head.index} written to {args.file} ({head.size} bytes of "
          f"checkpoint)\nstate digest {head.state_digest}")
    return 0


# --- users, roles, auth (cli_auth.py) -----------------------------------------------------


def cmd_auth_op(args: argparse.Namespace) -> int:
    """user ..., role ..., auth ...: one Auth operation, its answer printed as JSON."""
    try:
        op, params = cli_auth.auth_params(args)
    except ValueError as e:
        raise UsageError(str(e)) from None
    with _client(args) as c:
        print(_dump(c.auth(op, **params)))
    return 0


# --- server commands ---------------------------------------------------------------------

def _file_mode(text: str) -> int:
    try:
        mode = int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an octal file mode: {text!r}") from None
    if not 0 <= mode <= 0o777 or mode & 0o400 == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a mode from 0400 to 0777 that lets the "
                                         "owner read")
    return mode


def _comma_list(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def _node() -> Any:
    try:
        return importlib.import_module("gesmas.server.main")
    except ImportError as e:
        raise GesmasError(f"the server is not available in this installation: {e}") from None


def cmd_up(args: argparse.Namespace) -> int:
    if args.nodes < 1:
        raise UsageError("--nodes must be >= 1")
    return int(_node().run_up(args) or 0)


def cmd_certs(args: argparse.Namespace) -> int:
    try:
        certs = importlib.import_module("gesmas.server.certs")
    except ImportError as e:
        raise GesmasError(f"the server is not available in this installation: {e}") from None
    pki = certs.make_pki(args.dir, users=args.users, hosts=args.hosts, days=args.days)
    if args.server_key_mode is not None:
        # A container's user (uid 10001 in deploy/Dockerfile) reads the key through a bind
        # mount (a Compose file secret), which keeps the host's owner and mode: it needs
        # read access for others. Only the directory's owner may then enter the directory.
        os.chmod(args.dir, 0o700)
        os.chmod(pki.server_key, args.server_key_mode)
    print(f"CA {pki.ca_cert}; server {pki.server_cert} / {pki.server_key}")
    for user, (cert, key) in pki.clients.items():
        print(f"client {user}: {cert} / {key}")
    return 0


def cmd_server(args: argparse.Namespace) -> int:
    # flags, --config file and environment are merged by gesmas.server.config, in one place
    return int(_node().run_server(args) or 0)


# --- parser ------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see: {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument(
        "--cluster", default=os.environ.get("GESMAS_CLUSTER") or DEFAULT_CLUSTER,
        help="comma-separated client addresses (default: env GESMAS_CLUSTER, else %(default)s)",
    )
    common.add_argument("--retry-timeout", type=seconds, default=10.0, metavar="S",
                        help="give up after S seconds without a reachable leader "
                             "(default %(default)s)")
    common.add_argument("--consistency", choices=("linearizable", "sequential"),
                        default=os.environ.get("GESMAS_CONSISTENCY") or None,
                        help="of reads (declared readers, listings, status): linearizable "
                             "(the default; status: sequential, so it answers without a "
                             "leader) or sequential (env GESMAS_CONSISTENCY)")
    common.add_argument("--user", help="log in as USER (default: env GESMAS_USER); the "
                                       "password comes from env GESMAS_PASSWORD or a prompt")
    common.add_argument("--tls-ca", metavar="PEM", default=os.environ.get("GESMAS_TLS_CA"),
                        help="use TLS, trusting this CA (default: env GESMAS_TLS_CA)")
    common.add_argument("--tls-cert", metavar="PEM", default=os.environ.get("GESMAS_TLS_CERT"),
                        help="client certificate for mutual TLS (env GESMAS_TLS_CERT)")
    common.add_argument("--tls-key", metavar="PEM", default=os.environ.get("GESMAS_TLS_KEY"),
                        help="its key (env GESMAS_TLS_KEY)")
    as_json = _Parser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON")

    parser = _Parser(prog="gesmas", description="gesmas: a replicated coordination server.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser(
        "call", parents=[common], help="invoke a method on an object",
        description="Invoke METHOD on OBJECT of class CLASS and print the result as JSON.",
        epilog=VALUES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("cls", metavar="CLASS")
    p.add_argument("object", metavar="OBJECT")
    p.add_argument("method", metavar="METHOD")
    p.add_argument("args", metavar="ARG", nargs="*", help="positional arguments (see values)")
    p.add_argument("--kwargs", metavar="JSON", help="keyword arguments as a JSON object")
    p.add_argument("--create", metavar="JSON", nargs="?", const="[]",
                   help="create OBJECT first if it does not exist, with these constructor "
                        "arguments: a JSON list (positional) or object (keyword); "
                        "--create alone: none")
    p.add_argument("--timeout", type=seconds, metavar="S",
                   help="wait at most S seconds (0: do not wait; default: no limit)")
    p.set_defaults(func=cmd_call)

    p = sub.add_parser("upload", parents=[common], help="register the classes of a .py file",
                       description="Upload FILE (restricted-dialect Python) and print "
                                   '{"Class": version, ...}.')
    p.add_argument("file", metavar="FILE.py")
    p.set_defaults(func=cmd_upload)

    for name, func, text in (
        ("status", cmd_status, "leader, term, commit index, nodes, objects, waiters"),
        ("classes", cmd_classes, "list the registered classes"),
    ):
        p = sub.add_parser(name, parents=[common, as_json], help=text, description=text)
        p.set_defaults(func=func)
    sub.choices["status"].add_argument(
        "--digest", action="store_true",
        help="also the hash of the replicated state (O(state) on the replica; with auth on, "
             "an admin only): equal on replicas that applied the same log, and on a cluster "
             "restored from a backup to the one `gesmas backup` printed")
    p = sub.add_parser("objects", aliases=["ls"], parents=[common, as_json],
                       help="list the live objects",
                       description="List the live objects you may see, in name order "
                                   "(fetched 1,000 per request).")
    p.add_argument("--prefix", default="", help="only names that start with PREFIX")
    p.add_argument("--class", dest="class_name", metavar="CLASS", default="",
                   help="only objects of class CLASS")
    p.add_argument("--limit", type=_count, metavar="N",
                   help="at most N objects (default: all)")
    p.set_defaults(func=cmd_objects)

    p = sub.add_parser(
        "health", parents=[common], help="health check of one replica (for probes)",
        description="Ask ONE replica the gRPC health service (no login): exit 0 if it is "
                    "SERVING (it reaches a leader and keeps up), 1 if not or if it does not "
                    "answer. --live: exit 0 whenever it answers, a check of the process "
                    "alone, for a liveness probe (a replica cut off from the quorum is not "
                    "ready, but restarting it would not help).")
    p.add_argument("--address", metavar="HOST:PORT",
                   help="the replica (default: env GESMAS_HEALTH_ADDR, else env "
                        "GESMAS_CLIENT_ADDR, the replica's own address in its container, else "
                        "the first of --cluster)")
    p.add_argument("--tls-server-name", metavar="NAME",
                   help="the name its certificate must carry (default: the host of env "
                        "GESMAS_CLIENT_ADDR if set, else of the address dialled)")
    p.add_argument("--live", action="store_true",
                   help="succeed whenever the replica answers, SERVING or NOT_SERVING")
    p.add_argument("--service", default="", help="health service name (default: '')")
    p.add_argument("--timeout", type=seconds, default=5.0, metavar="S",
                   help="wait at most S seconds for the answer (default %(default)s)")
    p.set_defaults(func=cmd_health)

    p = sub.add_parser("admin", help="change the cluster's membership",
                       description="Membership changes, one at a time, through the leader "
                                   "(see README: Replacing a node).")
    admin = p.add_subparsers(dest="admin_command", metavar="ADMIN_COMMAND",
                             parser_class=_Parser)
    admin.required = True
    a = admin.add_parser("add-node", parents=[common], help="add a replica to the cluster",
                         description="Add the replica whose Raft address is RAFT_ADDR, then "
                                     "start it with a fresh --data-dir and --peers listing "
                                     "every current member.")
    a.add_argument("raft_addr", metavar="RAFT_ADDR", help="its --raft-addr, host:port")
    a.add_argument("--client-addr", metavar="ADDR",
                   help="its --client-addr, host:port (for leader hints)")
    a.set_defaults(func=cmd_add_node)
    a = admin.add_parser("remove-node", parents=[common],
                         help="remove a (dead) replica from the cluster",
                         description="Remove the replica whose Raft address is RAFT_ADDR.")
    a.add_argument("raft_addr", metavar="RAFT_ADDR", help="its --raft-addr, host:port")
    a.set_defaults(func=cmd_remove_node)

    p = sub.add_parser("backup", parents=[common], help="back up the replicated state",
                       description="Write a backup of the replicated state to FILE (atomically): "
                                   "a checkpoint taken at a fresh log index, with that index and "
                                   "the state digest there. Needs the admin permission with auth "
                                   "on. Restore: README 'Backup and restore'.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--timeout", type=seconds, default=300.0, metavar="S",
                   help="give up after S seconds (default %(default)s)")
    p.set_defaults(func=cmd_backup)

    cli_auth.add_commands(sub, common, _Parser, cmd_auth_op)
    cli_hold.add_commands(sub, common, _client, UsageError, seconds)
    cli_map.add_commands(sub, common, _Parser, cmd_map)

    p = sub.add_parser("certs", help="make a throw-away CA and certificates",
                       description="Write a CA, a server certificate for HOSTS and client "
                                   "certificates for USERS into DIR (for tests, demos and "
                                   "deploy/compose.yaml; use your own PKI in production).")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--hosts", type=_comma_list, default=["127.0.0.1", "localhost", "::1"],
                   help="names and addresses the server certificate is valid for")
    p.add_argument("--users", type=_comma_list, default=["root"],
                   help="client certificates to make (their common names)")
    p.add_argument("--days", type=int, default=365)
    p.add_argument("--server-key-mode", type=_file_mode, metavar="OCTAL",
                   help="mode of server.key (default 0600, its owner only). 0644 lets a "
                        "container's user read it as a Compose secret (deploy/compose.yaml: "
                        "the image runs as uid 10001); DIR is then made 0700, so that only "
                        "you (and root) can reach the files on the host")
    p.set_defaults(func=cmd_certs)

    p = sub.add_parser("up", help="run a local cluster in the foreground",
                       description="Start NODES server processes on 127.0.0.1 and wait.")
    p.add_argument("--nodes", type=int, default=3, help="number of nodes (default %(default)s)")
    p.add_argument("--base-port", type=int, default=7100,
                   help="node i (1..NODES) serves clients on BASE+i (Raft: BASE+100+i, or see "
                        "--raft-port) "
                        "(default %(default)s; 0: free ports the OS picks, printed at start)")
    p.add_argument("--raft-port", type=int, metavar="BASE",
                   help="node i talks Raft on BASE+i (default: --base-port + 100; 0: free)")
    p.add_argument("--metrics-port", type=int, metavar="BASE",
                   help="node i serves Prometheus metrics and its status page over HTTP on "
                        "BASE+i (0: free ports; printed at start; default: none)")
    p.add_argument("--data-dir", metavar="DIR", help="where the nodes keep their data")
    p.add_argument("--unsafe-no-fsync", action="store_true",
                   help="do not fsync the journal (fast, loses data on power failure)")
    p.add_argument("--tls", action="store_true",
                   help="TLS and auth: make a throw-away CA, certificates and a root password "
                        "(printed as the environment a client needs)")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("server", help="run one server node",
                       description="Run one node. Flags override the --config file.")
    p.add_argument("--id", help="node id: an integer, or from-hostname (the ordinal at the "
                                "end of the host name + 1, for a StatefulSet); env GESMAS_ID")
    p.add_argument("--config", metavar="FILE",
                   help="JSON object with the same keys as the flags (client_addr, ...)")
    p.add_argument("--client-addr", metavar="HOST:PORT", help="gRPC address for clients")
    p.add_argument("--raft-addr", metavar="HOST:PORT", help="Raft address of this node")
    p.add_argument("--peers", type=_comma_list, metavar="RAFT=CLIENT,...",
                   help="the OTHER nodes, comma-separated, each RAFT-ADDR=CLIENT-ADDR (the "
                        "client address lets this node tell clients where the leader is)")
    p.add_argument("--data-dir", metavar="DIR", help="journal and snapshot directory")
    p.add_argument("--secret", help="cluster secret (default: env GESMAS_CLUSTER_SECRET)")
    p.add_argument("--secret-file", metavar="FILE",
                   help="read the cluster secret from FILE (a Docker or Kubernetes secret; "
                        "env GESMAS_SECRET_FILE)")
    p.add_argument("--unsafe-no-fsync", action="store_true", default=None,
                   help="do not fsync the journal (fast, loses data on power failure)")
    p.add_argument("--tls-cert", metavar="PEM", help="TLS certificate of the client port "
                   "(env GESMAS_TLS_CERT)")
    p.add_argument("--tls-key", metavar="PEM", help="its private key (env GESMAS_TLS_KEY)")
    p.add_argument("--tls-client-ca", metavar="PEM",
                   help="require client certificates signed by this CA: mutual TLS; a "
                        "certificate's common name is its user (env GESMAS_TLS_CLIENT_CA)")
    p.add_argument("--root-password-file", metavar="FILE",
                   help="on a new cluster, create the user root with this password and enable "
                        "auth (env GESMAS_ROOT_PASSWORD_FILE)")
    p.add_argument("--insecure", action="store_true", default=None,
                   help="allow a client port that is not loopback without TLS and auth "
                        "(anyone who reaches it can do everything)")
    p.add_argument("--metrics-addr", metavar="HOST:PORT",
                   help="serve Prometheus metrics over HTTP here (env GESMAS_METRICS_ADDR; "
                        "default: off)")
    p.add_argument("--log-format", choices=["text", "json"],
                   help="one line per event as text (default) or JSON objects, for log "
                        "shippers (env GESMAS_LOG_FORMAT; the level: env GESMAS_LOG)")
    p.add_argument("--new-cluster", action="store_true", default=None,
                   help="first start of a new cluster: an empty data dir is expected. Without "
                        "it, a replica that starts empty is taken to have lost its disk and "
                        "does not vote until it has caught up (README 'A replica that lost its "
                        "disk'; env GESMAS_NEW_CLUSTER)")
    p.add_argument("--snapshot-every", type=int, metavar="ENTRIES",
                   help="log entries between two snapshots, after which the log before the "
                        "snapshot is dropped (default 20000, at least 100; etcd's "
                        "--snapshot-count; env GESMAS_SNAPSHOT_EVERY). A snapshot holds the "
                        "last checkpoint (every 20000 commands: config key checkpoint_every) and "
                        "the commands since; taken more often than checkpoints, it writes the "
                        "same checkpoint again")
    p.add_argument("--max-stream-calls", type=int, metavar="CALLS",
                   help="calls this replica keeps in flight on its clients' call streams, "
                        "blocked ones included; past it a call fails RESOURCE_EXHAUSTED "
                        "(TooManyCalls) at once. Each costs the replica ~5 KB (default 150000; "
                        "env GESMAS_MAX_STREAM_CALLS)")
    p.add_argument("--runaway-limit", type=float, metavar="SECONDS",
                   help="CPU seconds one log entry may burn on the apply thread before the "
                        "watchdog kills this replica and the cluster aborts the entry "
                        "(default 10; 0: no watchdog; README 'A call that runs away'; env "
                        "GESMAS_RUNAWAY_LIMIT)")
    p.add_argument("--restore", metavar="BACKUP",
                   help="first start of a NEW cluster from a backup (`gesmas backup`): check it, "
                        "seed the empty data dir with its state, then run. Give every replica "
                        "of the new cluster the same file; remove the flag for later starts "
                        "(README 'Backup and restore')")
    p.add_argument("--restore-only", action="store_true",
                   help="with --restore: seed the data dir and exit 0 without serving (then "
                        "start the replica as usual, e.g. with its unit)")
    p.add_argument("--skip-entry", type=int, action="append", metavar="INDEX",
                   dest="skip_entries",
                   help="recovery only: complete log entry INDEX with an INTERNAL error "
                        "instead of applying it (repeatable; give every replica the same "
                        "list; README 'A poison log entry')")
    p.set_defaults(func=cmd_server)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status (0 ok, 1 error, 2 usage, 130 interrupt)."""
    parser = build_parser()
    own, cmd = cli_hold.split_command(sys.argv[1:] if argv is None else argv)
    try:
        try:
            args = parser.parse_args(own)
        except SystemExit as e:  # --help
            return e.code if isinstance(e.code, int) else 0
        if cmd is not None:
            args.cmd = cmd              # lock, elect: the command after --
        func: Callable[[argparse.Namespace], int] = args.func
        status = func(args)
        sys.stdout.flush()                # a closed pipe shows here, not at exit
        return status
    except BrokenPipeError:
        # the reader went away (`gesmas objects | head`): stop quietly, as `yes | head` does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141                        # 128 + SIGPIPE, what a shell reports for it
    except UsageError as e:
        print(f"gesmas: {e}", file=sys.stderr)
        return 2
    except GesmasError as e:
        print(f"gesmas: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # e.g. a server command's port is taken
        print(f"gesmas: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("gesmas: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
