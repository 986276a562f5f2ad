"""Running ``ckptsim`` in the test's own process, as the CLI tests do."""

from __future__ import annotations

from simulator.cli import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """(status, stdout, stderr) of ``ckptsim ARGV`` run in this process."""
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's own errors exit from inside parse_args
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err
