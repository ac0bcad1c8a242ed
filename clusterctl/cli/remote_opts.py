"""`--remote [USER@]HOST` on the commands that talk to the scheduler: the same command, run on a login node.

The command line is rebuilt from what typer parsed (never from sys.argv), minus
--remote, and run by the login node's clusterctl over one SSH connection; its
output is shown here as it comes and its exit code becomes this one's.
"""

from __future__ import annotations

from typing import Annotated, Any, NoReturn, Optional

import typer

from clusterctl.remote.client import REMOTE_ENV, connect
from clusterctl.remote.client import target as remote_target  # noqa: F401 - the commands' one way to read --remote

RemoteOpt = Annotated[
    Optional[str],
    typer.Option("--remote", metavar="[USER@]HOST", show_default=False,
                 help=f"run on the cluster's login node over SSH (an ~/.ssh/config alias works; default ${REMOTE_ENV})"),
]


def _flag(param: Any, value: Any) -> list[str]:
    if param.secondary_opts:  # --verify/--no-verify
        return [param.opts[0] if value else param.secondary_opts[0]] if value != param.default else []
    return [param.opts[0]] if value else []


def forwarded_args(ctx: typer.Context) -> list[str]:
    """The command as parsed, written out again without --remote: what the login node runs."""
    args: list[str] = [ctx.info_name or ctx.command.name or ""]
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        if param.name == "remote" or value is None:
            continue
        if param.param_type_name == "argument":
            args += [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]
        elif param.param_type_name == "option":
            if param.is_flag:
                args += _flag(param, value)
            elif param.multiple:
                for item in value:
                    args += [param.opts[0], str(item)]
            elif value != param.default:
                args += [param.opts[0], str(value)]
    return args


def run_there(remote: str, ctx: typer.Context) -> NoReturn:
    """Run this command on the login node, show its output, exit with its code."""
    with connect(remote) as link:
        code = link.forward(forwarded_args(ctx))
    raise typer.Exit(code)
