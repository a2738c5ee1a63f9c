"""A thin task harness that runs Pathfinder's GAIA-like tasks on AG2 (the `autogen` package).

Everything that decides how the agents talk, call tools, select speakers and stop is AG2's own
code, vendored beside this package; the harness only builds the agents for a task, gives them
the corpus tools, and turns AG2's OpenTelemetry spans into the trace contract.
"""

FRAMEWORK = "ag2"
