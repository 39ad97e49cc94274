"""One run: preflight, the fit check, conversion to torchtitan's config, the worker and what it records."""
