"""`ringserve` command line: serve, ctl, export, train, evaluate."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import sys
from typing import Any

from ringserve.service.config import settings as S
from ringserve.service.protocols import auth

USAGE = """ringserve <command> [options]   (ringserve --version: the version)

commands:
  serve      start the server (see `ringserve serve --help`; `--config FILE` reads a TOML file)
  config     show [--config FILE] [flags]: the effective settings and where each came from |
             check FILE: validate a config file without starting | schema: its JSON Schema
  ctl        control a running server: status | restart ID | scale N | drain | reload |
             models | load NAME [--version V] | unload NAME
  export     build a model artifact from an encoder directory and a classifier head
  train      fit a classifier head on frozen encoder embeddings from a labelled TSV
  evaluate   print the held-out accuracy of a model artifact (default: the built-in model)
  batch      score a whole file offline through the worker pool (no HTTP)
  corpus     pack texts into binary-protocol frames, read with mmap
"""


def serve_main(argv: list[str]) -> int:
    from ringserve.service.config import file as config_file

    try:
        resolved = config_file.resolve(argv)
    except config_file.ConfigError as exc:
        print(f"ringserve: {exc}", file=sys.stderr)
        return 2
    cfg = resolved.config
    keep_key_out_of_sight(cfg.api_key)
    from ringserve.service.app import serve

    return serve(cfg)


CONFIG_HELP = """the TOML file of `ringserve serve --config FILE` (docs/api.md, The config file)

  show [--config FILE] [serve flags]  every effective setting, its value and where it came
                                      from: flag, env RINGSERVE_X, FILE:LINE or default
  check FILE                          validate FILE without starting (exit 0, or 2 naming the
                                      file, the line and the key)
  schema                              the file's JSON Schema"""


def config_main(argv: list[str]) -> int:
    """`ringserve config show|check|schema`: nothing starts."""
    from ringserve.service.config import file as config_file

    usage = "ringserve config show [--config FILE] [serve flags] | check FILE | schema"
    if argv and argv[0] in ("-h", "--help"):
        print(f"usage: {usage}\n\n{CONFIG_HELP}")
        return 0
    if not argv or argv[0] not in ("show", "check", "schema"):
        print(f"usage: {usage}", file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "schema":
        print(json.dumps(S.toml_schema(), indent=2))
        return 0
    if command == "check" and len(rest) != 1:
        print("usage: ringserve config check FILE", file=sys.stderr)
        return 2
    try:
        resolved = config_file.resolve(["--config", rest[0]] if command == "check" else rest,
                                       prog=f"ringserve config {command}")  # fmt: skip
    except config_file.ConfigError as exc:
        print(f"ringserve: {exc}", file=sys.stderr)
        return 2
    if command == "show":
        print(config_file.show(resolved))
        return 0
    file = resolved.file
    assert file is not None
    from ringserve.service.config.settings import ModelTableError
    from ringserve.service.models.info import check_tables

    try:  # the tables' settings against their artifacts, as the start checks them
        check_tables(resolved.config)
    except ModelTableError as exc:
        print(f"ringserve: {exc}", file=sys.stderr)
        return 2
    print(f"{file.path}: ok ({len(file.options)} settings, {len(file.models)} models)")
    return 0


def keep_key_out_of_sight(key: str | None) -> None:
    """Take the key out of the environment (the workers and whatever they start never get it)
    and out of what /proc shows of this process: its command line (`ps`) and its environment."""
    os.environ.pop(auth.ENV, None)  # unsetenv: from here on only the stale block holds it
    if not key:
        return
    on_command_line = any(a.startswith("--api-key") and a[9:10] in ("", "=") for a in sys.argv)
    if not auth.scrub_process(key, on_command_line):
        print(
            "ringserve: warning: could not hide --api-key from `ps`; use RINGSERVE_API_KEY",
            file=sys.stderr,
        )


def ctl_request(path: str, request: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
    """One request on the control socket; the server's key, when RINGSERVE_API_KEY holds one,
    goes with it as `"key"`."""
    key = os.environ.get(auth.ENV)
    if key and "key" not in request:
        request = {**request, "key": key}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(json.dumps(request).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    reply: dict[str, Any] = json.loads(data)
    return reply


def ctl_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ringserve ctl", description="control a running server")
    parser.add_argument(
        "--control", default=os.environ.get("RINGSERVE_CONTROL", "./ringserve.sock")
    )
    commands = ["status", "restart", "scale", "drain", "reload", "models", "load", "unload"]
    parser.add_argument("command", choices=commands)
    parser.add_argument(
        "arg", nargs="?", help="worker id (restart), count (scale) or model name (load, unload)"
    )
    parser.add_argument("--version", type=int, help="load: this version (default: the highest)")
    args = parser.parse_args(argv)
    request: dict[str, object] = {"cmd": args.command}
    if args.command in ("restart", "scale"):
        if args.arg is None or not args.arg.lstrip("-").isdigit():
            parser.error(f"{args.command} needs a number")
        request["worker" if args.command == "restart" else "workers"] = int(args.arg)
    if args.command in ("load", "unload"):
        if not args.arg:
            parser.error(f"{args.command} needs a model name")
        request["model"] = args.arg
        if args.version is not None and args.command == "load":
            request["version"] = args.version
    # A load or unload answers once the workers are rolled: seconds each, more on a busy host.
    timeout = 900.0 if args.command in ("load", "unload", "reload") else 30.0
    try:
        reply = ctl_request(args.control, request, timeout)
    except OSError as exc:
        print(f"ringserve ctl: cannot reach {args.control}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(reply, indent=2))
    return 0 if reply.get("ok") else 1


# Commands that build or read TorchScript: an install without the `full` extra (the CPU serving
# image's) lacks torch, and says so in one sentence rather than a traceback.
TORCH_COMMANDS = ("export", "train", "evaluate")


def torch_missing(command: str) -> str | None:
    if command not in TORCH_COMMANDS or importlib.util.find_spec("torch") is not None:
        return None
    return (
        f"ringserve {command}: needs torch, which this install lacks (a serving-only install, "
        "such as the CPU serving image): `pip install 'ringserve[full]'` adds it"
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command in ("--version", "-V"):
        from ringserve.service.version import version

        print(f"ringserve {version()}")
        return 0
    if command == "serve":
        return serve_main(rest)
    if command == "ctl":
        return ctl_main(rest)
    if command == "config":
        return config_main(rest)
    missing = torch_missing(command)
    if missing:
        print(missing, file=sys.stderr)
        return 2
    if command == "export":
        from ringserve.factory import export

        return export.main(rest)
    if command == "train":
        from ringserve.factory import train

        return train.main(rest)
    if command == "batch":
        from ringserve.service.offline import batch

        return batch.main(rest)
    if command == "corpus":
        from ringserve.service.offline import corpus

        return corpus.corpus_main(rest)
    if command == "evaluate":
        from ringserve.factory import train

        return train.evaluate_main(rest)
    print(f"ringserve: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
