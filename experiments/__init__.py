"""Studies that regenerate the reports in ``reports/``: one script per question."""
