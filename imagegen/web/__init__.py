"""The browser page (index.html, page.js, worker.js, sampler.js, draw.js) and the site an export writes (site.py)."""

__all__ = ["site"]
