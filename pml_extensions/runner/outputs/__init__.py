"""What a run reports: ``results.json`` / ``results.md`` with paired statistics, and ``report.html``."""
