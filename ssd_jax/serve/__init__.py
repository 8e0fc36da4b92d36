"""An OpenAI-compatible HTTP server over a Pipeline (`python scripts/serve.py`; docs/serving.md).

protocol.py reads and checks a request's JSON body and writes OpenAI's response objects (no HTTP, no model);
reply.py turns one row's tokens into the text a request may be sent (its max_tokens, the model's stop ids, its stop
strings); engine.py is the worker thread that owns the Pipeline and runs waiting requests in batches; app.py is the
HTTP layer (Starlette, run by uvicorn). Only app.py imports Starlette or uvicorn (the `serve` extra), and nothing
outside this package imports it, so `import ssd_jax` needs neither.
"""
