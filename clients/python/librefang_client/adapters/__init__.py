"""Adapters: this service behind the interfaces agent frameworks already use, one module per framework (mem0's
call shapes in `mem0`, openai-agents' Session in `openai_agents`,
LangGraph's BaseStore in `langgraph`). Each takes `url` and `token` (or
LIBREFANG_URL / LIBREFANG_TOKEN) like the client."""
