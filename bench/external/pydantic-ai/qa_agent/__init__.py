"""A question-answering agent built on Pydantic AI: the target of the external labelled set."""
