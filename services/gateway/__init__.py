"""The gateway service: the `/v1` HTTP API (admin and worker protocol) of CONTRACT.md."""
