"""Model backends: generators, VLMs, editors, and the HTTP transport they share."""
