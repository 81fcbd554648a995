"""What a run reports: ``results.json`` / ``results.md`` with paired statistics and verdicts, their tables (one table
model rendered to Markdown and HTML), and ``report.html``."""
