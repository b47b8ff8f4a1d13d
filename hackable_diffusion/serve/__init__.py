"""Serving: an OpenAI-compatible HTTP server over a toolbox run (`python -m hackable_diffusion.serve`).

`engine` batches concurrent requests into compiled generations and streams them canvas by canvas (`requests`: what a
request holds, its settings and errors, the engine's counters), `app` is the HTTP API (Starlette, run by uvicorn;
`pip install -e '.[serve]'`), `chat` turns messages into a prompt, `metrics` writes the Prometheus page,
`page/index.html` is the live view of a canvas denoising.
"""
