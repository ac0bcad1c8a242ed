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


class ErrorHandlingGroup(TyperGroup):
    """Turns ClusterctlError into its exit code and any other exception into exit 1, never a traceback."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except ClusterctlError as exc:
            report_error(exc)
            raise typer.Exit(int(exc.exit_code)) from None
        except KeyboardInterrupt:
            err_console.print("interrupted")
            raise typer.Exit(130) from None
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
