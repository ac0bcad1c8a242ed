"""The typer application and the one place user-facing errors become exit codes."""

from __future__ import annotations

import sys
from typing import Any

import typer
from rich.console import Console
from rich.text import Text
from typer.core import TyperGroup

from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import BUG_REPORT_HINT, ExitCode

err_console = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)


def out_console() -> Console:
    """Standard output; markup off because messages carry user values such as `gpu-[001-004]`."""
    return Console(highlight=False, markup=False, soft_wrap=True)  # a path on one line, for scripts that read it


def report_error(exc: ClusterctlError) -> None:
    # Messages quote user input verbatim: never let rich read them as markup.
    err_console.print(Text.assemble(("error: ", "bold red"), exc.message))


# The help's command groups, in the order a newcomer meets them; a command in none is listed under "Other".
PANELS: dict[str, tuple[str, ...]] = {
    "Run": ("plan", "render", "submit", "qualify"),
    "Inspect": ("status", "runs", "logs", "report", "trace", "record", "checkpoints"),
    "Recover": ("cancel", "requeue", "drill", "suspects"),
    "Site": ("site",),
    "Develop": ("schema", "version"),
}


def _metavar(param: Any) -> str:
    """One placeholder style: upper case, from the parameter's name (`--runs-root` takes RUNS_ROOT)."""
    return (param.name or "value").upper()


class ErrorHandlingGroup(TyperGroup):
    """Turns ClusterctlError into its exit code and any other exception into exit 1, never a traceback.

    It also gives the help its shape: commands in groups (PANELS), each with
    its whole first line, and one placeholder style for every value.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for command in self.commands.values():
            for param in command.params:
                flag = getattr(param, "is_flag", False) or getattr(param, "count", False)
                if getattr(param, "metavar", None) is None and not flag:
                    param.metavar = _metavar(param)
                if getattr(param, "param_type_name", "") == "argument":
                    param.display_type_rich = lambda ctx=None: None  # `SPEC`, not `SPEC <path>`: the placeholder says it

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        shown = {name: cmd for name in self.list_commands(ctx) if (cmd := self.get_command(ctx, name)) and not cmd.hidden}
        placed = {name for names in PANELS.values() for name in names}
        groups = [*PANELS.items(), ("Other", tuple(n for n in shown if n not in placed))]
        for title, names in groups:
            rows = [(n, shown[n].get_short_help_str(limit=200)) for n in names if n in shown]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except ClusterctlError as exc:
            report_error(exc)
            raise typer.Exit(int(exc.exit_code)) from None
        except KeyboardInterrupt:
            err_console.print("interrupted")
            raise typer.Exit(130) from None
        except PermissionError as exc:  # another user's run (private, or shared with a group we are not in)
            where = exc.filename or "a file"
            report_error(ClusterctlError(f"permission denied: {where} (it belongs to another user and is not shared"
                                         " with you: see runs_mode)", ExitCode.NO_PERMISSION))
            raise typer.Exit(int(ExitCode.NO_PERMISSION)) from None
        except Exception as exc:  # noqa: BLE001 - last line of defence
            if isinstance(exc, typer.Abort) or getattr(exc, "exit_code", None) is not None:
                raise  # the CLI framework's own usage errors and exits
            err_console.print(Text.assemble(("internal error: ", "bold red"), f"{type(exc).__name__}: {exc}"))
            err_console.print(BUG_REPORT_HINT)
            if "--debug" in sys.argv:
                raise
            raise typer.Exit(int(ExitCode.BUG)) from None


def new_app(help_text: str) -> typer.Typer:
    return typer.Typer(
        cls=ErrorHandlingGroup,
        help=help_text,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
    )
