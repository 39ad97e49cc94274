"""Small helpers every layer uses: errors, redaction, quiet imports, the host allocator."""
