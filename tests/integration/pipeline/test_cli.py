"""Command line: the planner's dry run on the embedded model's config and tokenizer, and its refusals."""

from qkplast.pipeline.cli import main
from tests.helpers import one_line_error


def test_dry_run_prints_the_plan_and_captures_nothing(tmp_path, capsys):
    """The planner reads config and tokenizer only: windows, heads, expected peak, verdict; no run directory."""
    out = tmp_path / "run"
    assert main(["run", "--dry-run", "--preset", "fast", "--docs", "3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "windows (yielded / wanted)  3 / 3" in text and "2048 / 128 (16 buckets)" in text
    assert "verdict                     fits" in text and "dry run: nothing captured" in text
    assert not out.exists()


def test_dry_run_refuses_what_does_not_fit(capsys):
    one_line_error(capsys, ["run", "--dry-run", "--preset", "fast", "--device-memory-gb", "0.05"],
                    "exceeds the 0.1 GiB")
    one_line_error(capsys, ["plan", "--preset", "fast", "--corpus", "pydoc-topics", "--docs", "100000"],
                    "yields", "100000")
