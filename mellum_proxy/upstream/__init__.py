"""Talking to the model server: `client.UpstreamClient` (the transport), each kind of server in `servers/`, the
event-stream reader, the pass-through relay, the translation of transport errors, and the embedded llama.cpp
server. Nothing is imported here, so the settings can read the kinds without loading the client."""
