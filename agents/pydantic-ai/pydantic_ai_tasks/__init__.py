"""A thin task harness that runs Pathfinder's GAIA-like tasks on Pydantic AI (the `pydantic_ai`
package).

Everything that decides how the agent calls the model, builds tool schemas, validates and runs
tool calls, retries and stops is Pydantic AI's own code, vendored beside this package; the
harness only builds the agent for a task, gives it the corpus tools, and turns Pydantic AI's
OpenTelemetry spans into the trace contract.
"""

FRAMEWORK = "pydantic-ai"
