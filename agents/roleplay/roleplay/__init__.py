"""roleplay: a CAMEL-style role-playing society (AI user, AI assistant, critic) with tools."""
