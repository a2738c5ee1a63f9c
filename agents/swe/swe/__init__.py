"""SWE: a software-engineering agent with an agent-computer interface (SWE-agent style)."""
