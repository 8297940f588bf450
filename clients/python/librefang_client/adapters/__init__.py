"""Adapters: this service behind the interfaces agent frameworks already use, one module per framework (mem0's
call shapes in `mem0`, openai-agents' Session in `openai_agents`, LangGraph's BaseStore in `langgraph`,
LlamaIndex's memory block in `llama_index`, Hermes Agent's MemoryProvider and ContextEngine in `hermes`). Each
takes `url` and `token` (or LIBREFANG_URL / LIBREFANG_TOKEN) like the client."""
